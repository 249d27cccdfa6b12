"""InfoNCE's interaction directions: which similarity blocks join each query's softmax, and how they are normalised.

For query i, positive p_i and the documents d = [p_1..p_N; n_1..n_{Nh}] (hard negative r belongs to query r // h):

                                                                          block         negatives in row i
    query_to_doc         s(q_i, d_j) for every document                       (N, N(1+h)),  N(1+h) - 1 (target column i)
    query_to_query       s(q_i, q_j), j != i                                  (N, N),       N - 1
    doc_to_query         s(p_i, q_j) for every query                          (N, N),       N - 1 (target column i)
    doc_to_doc           s(p_i, d_j), d_j not a document of query i           (N, N(1+h)),  (N - 1)(1+h)
    positive_to_positive s(p_i, p_j), j != i                                  (N, N),       N - 1

partition_mode "joint":          L_i = log sum over the chosen blocks' entries of exp(l) - l_{i,i}^{query_to_doc}
partition_mode "per_direction":  L_i = mean over the chosen blocks B of (log sum_j exp(l^B_ij)) - l_{i,i}^{query_to_doc}

The first four are sentence-transformers' ``MultipleNegativesRankingLoss(directions=..., partition_mode=...)``;
``positive_to_positive`` is GISTEmbedLoss's ``contrast_positives`` block (positives only, no hard negatives), and
``query_to_query`` its ``contrast_anchors`` block. Excluded pairs are set to -inf (dropped from the sums).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["DIRECTIONS", "PARTITION_MODES", "SYMMETRIC", "check_directions", "check_partition_mode", "score_blocks",
           "excluded_pairs", "negatives_of_pair", "owned_documents"]

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc", "positive_to_positive")
PARTITION_MODES = ("joint", "per_direction")
SYMMETRIC = ("query_to_doc", "doc_to_query")  # with "per_direction": what ``symmetric=True`` stands for
_SAME_TYPE = ("query_to_query", "doc_to_doc", "positive_to_positive")  # blocks without the positive pair


def check_directions(directions: object) -> tuple[str, ...]:
    """Return ``directions`` as a tuple of distinct known names that includes "query_to_doc".

    Raises:
        TypeError: ``directions`` is a string or not a sequence.
        ValueError: an unknown or repeated name, or no "query_to_doc".
    """
    if isinstance(directions, str) or not isinstance(directions, Sequence):
        raise TypeError(
            f"directions must be a tuple of names from {DIRECTIONS}, got {directions!r}; for one direction write "
            f"('query_to_doc',)"
        )
    names = tuple(directions)
    unknown = [name for name in names if name not in DIRECTIONS]
    if unknown:
        raise ValueError(f"directions has unknown names {unknown}; valid names are {DIRECTIONS}")
    if len(set(names)) != len(names):
        raise ValueError(f"directions lists a name twice: {names!r}; list each direction once")
    if "query_to_doc" not in names:
        raise ValueError(
            f"directions must include 'query_to_doc' (the block holding each query's positive), got {names!r}"
        )
    # Canonical order, so that equal sets of directions build equal losses.
    return tuple(name for name in DIRECTIONS if name in names)


def check_partition_mode(partition_mode: object, directions: tuple[str, ...]) -> str:
    """Return ``partition_mode`` if it is "joint" or "per_direction" and fits ``directions``; raise otherwise."""
    if partition_mode not in PARTITION_MODES:
        raise ValueError(f"partition_mode must be one of {PARTITION_MODES}, got {partition_mode!r}")
    same_type = [name for name in directions if name in _SAME_TYPE]
    if partition_mode == "per_direction" and same_type:
        raise ValueError(
            f"partition_mode='per_direction' needs every direction's softmax to hold the positive pair, but "
            f"{same_type} score only same-type pairs; use partition_mode='joint' or drop them from directions"
        )
    return partition_mode


def owned_documents(n: int, hard_negatives: int, device: torch.device) -> torch.Tensor:
    """(N, N(1+h)) bool: True where document j belongs to query i (its positive or one of its hard negatives)."""
    queries = torch.arange(n, device=device)
    owner = torch.cat([queries, queries.repeat_interleave(hard_negatives)])  # (N(1+h),): the query of each doc
    return queries[:, None] == owner[None, :]


def score_blocks(query: torch.Tensor, documents: torch.Tensor, n: int, in_batch: int,
                 directions: Sequence[str]) -> dict[str, torch.Tensor]:
    """The raw similarity block of each direction, before scaling or masks (rows already unit, or raw for dot).

    Args:
        query: (N, D); documents: (N(1+h) + Q, D), positives first, then hard negatives grouped by query, then
            queued rows (query_to_doc only); n: N; in_batch: N(1+h), the documents before the queue.
    """
    positive = documents[:n]  # (N, D)
    blocks = {"query_to_doc": query @ documents.T}  # (N, N(1+h) + Q)
    if "query_to_query" in directions:
        blocks["query_to_query"] = query @ query.T  # (N, N)
    if "doc_to_query" in directions:
        # p_i . q_j is entry (j, i) of query_to_doc: its transpose, no second product.
        blocks["doc_to_query"] = blocks["query_to_doc"][:, :n].T  # (N, N)
    if "doc_to_doc" in directions:
        blocks["doc_to_doc"] = positive @ documents[:in_batch].T  # (N, N(1+h))
    if "positive_to_positive" in directions:
        blocks["positive_to_positive"] = positive @ positive.T  # (N, N)
    return blocks


def excluded_pairs(direction: str, n: int, hard_negatives: int, device: torch.device) -> torch.Tensor | None:
    """(N, M) bool of the pairs ``direction`` leaves out (self pairs, a positive's own documents), or None."""
    if direction in ("query_to_query", "positive_to_positive"):
        return torch.eye(n, dtype=torch.bool, device=device)
    if direction == "doc_to_doc":
        return owned_documents(n, hard_negatives, device)
    return None


def negatives_of_pair(direction: str, n: int, hard_negatives: int) -> int:
    """Entries of row i of ``direction``'s block that are neither the positive pair (q_i, p_i) nor excluded.

    doc_to_query's entry (i, i) is s(p_i, q_i), the positive pair again: not a negative. A queue adds its rows to
    query_to_doc only; ``InfoNCE.negatives_per_anchor`` leaves it to the caller.
    """
    documents = n * (1 + hard_negatives)  # positives, then the hard negatives
    return {"query_to_doc": documents - 1, "query_to_query": n - 1, "doc_to_query": n - 1,
            "doc_to_doc": documents - (1 + hard_negatives), "positive_to_positive": n - 1}[direction]
