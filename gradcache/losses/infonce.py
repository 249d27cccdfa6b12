"""InfoNCE with in-batch and hard negatives: the loss of dense retrieval (DPR) and sentence embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .base import LossBase, check_counts
from .checks import check_embeddings, check_same_rows
from .directions import (SYMMETRIC, check_directions, check_partition_mode, excluded_pairs, negatives_of_pair,
                         score_blocks)
from .guided import check_guide, check_margin_strategy, false_negatives
from .hardness import check_hardness, hardness_penalty
from .precision import compute_dtype, full_precision, unit_rows
from .queue import EmbeddingQueue
from .tiled_logsumexp import tiled_logsumexp

__all__ = ["InfoNCE"]

SIMILARITIES = ("cosine", "dot")


class InfoNCE(LossBase):
    """Cross-entropy of each query against every positive and hard negative in the batch, its own positive the target.

    L = -1/N sum_i log( exp(q_i.p_i / t) / (sum_j exp(q_i.p_j / t) + sum_k exp(q_i.n_k / t)) ), on unit vectors.

    Paper: van den Oord et al. 2018, https://arxiv.org/abs/1807.03748 (with DPR's in-batch and hard negatives,
    Karpukhin et al. 2020, https://arxiv.org/abs/2004.04906).

    The defaults are sentence-transformers' ``MultipleNegativesRankingLoss(scale=1/t)``; its options have these
    counterparts (same names where the meaning is the same):

        similarity_fct=cos_sim | dot_score   ->  similarity="cosine" | "dot"
        scale                                ->  temperature = 1 / scale
        directions, partition_mode           ->  directions, partition_mode (see ``directions.py``)
        hardness_mode, hardness_strength     ->  hardness_mode, hardness_strength (see ``hardness.py``)
        gather_across_devices=True           ->  GradCache/CachedLoss/FullBatch with ``gather=True`` (the default)
        GISTEmbedLoss(guide, margin_strategy, margin, contrast_anchors, contrast_positives)
            -> margin_strategy, margin, ``forward(..., guide=...)``, directions + "query_to_query" (anchors),
               + "positive_to_positive" (positives), partition_mode "joint" (see ``guided.py``)

    Args:
        temperature: t > 0; divides the similarity (ST's ``scale`` = 1 / t).
        symmetric: shorthand for ``directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"``:
            also score each positive against all queries (target: its own query) and average the two
            directions; hard negatives take part only in the query-to-positive direction. Not combinable with
            ``directions`` or ``partition_mode``.
        tile_size: None for the dense (N, N * (1 + h)) logits; an int to compute forward and backward in tiles
            of that many queries, memory O(tile_size * column_tile_size + N * (1 + h)) above the embeddings and
            their gradients, same value and gradients. Tiles support cosine similarity, the default directions
            and ``symmetric``; ``similarity="dot"``, other directions, ``hardness_mode`` and ``guide`` raise a
            ValueError with tiles.
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles of ``tile_size``.
            At least N * (1 + h) gives strips of ``tile_size`` rows against every column.
        queue_size: 0 for in-batch negatives only; Q > 0 to keep the last Q candidate rows (positives and hard
            negatives) of earlier calls, detached, as extra negatives of every query: sum_k over the queue joins
            the query_to_doc block (no other direction). It advances once per call with gradients on and a
            finite loss: once per step under GradCache, CachedLoss and FullBatch, once per micro-batch under
            NaiveAccumulation. See ``gradcache/losses/queue.py``. Not combinable with ``hardness_mode`` or a guide.
        queue_warmup: calls with gradients before the queue is read or filled (XBM's warm-up); needs Q > 0.
        similarity: "cosine" (unit rows, the default) or "dot" (raw inner products, ST's ``dot_score``).
        directions: tuple of blocks in each query's softmax, from "query_to_doc" (required), "query_to_query",
            "doc_to_query", "doc_to_doc", "positive_to_positive"; None for ("query_to_doc",).
        partition_mode: "joint" (one softmax over all blocks; None means this) or "per_direction" (one softmax per
            block, averaged; only for directions whose blocks hold the positive pair).
        hardness_mode: None, "in_batch_negatives", "hard_negatives" or "all_negatives": add
            ``hardness_strength * stopgrad(similarity)`` to those negatives' logits (not divided by t).
        hardness_strength: alpha >= 0; must be 0 without ``hardness_mode``.
        margin_strategy: with a guide, drop candidates the guide scores above g(q_i, p_i) - margin ("absolute") or
            g(q_i, p_i) - |g(q_i, p_i)| * margin ("relative"); GISTEmbedLoss's rule, on every chosen block.
        margin: the margin of ``margin_strategy``.

    Shapes (``forward(query, positive, negatives=None, *, guide=None)``):
        query: (N, D); positive: (N, D), row i is the positive of query i; negatives: optional (N * h, D),
        h hard negatives per query, rows i*h .. i*h+h-1 belonging to query i (every query sees all of them).
        guide: optional tuple of the guide model's embeddings of the same rows, (N, D'), (N, D')[, (N * h, D')],
        constants (their gradient is never taken); cosine similarity whatever ``similarity`` is.
        Returns a 0-dim tensor in float32 (float64 for float64 inputs).

    Raises:
        ValueError: temperature <= 0, bad tile_size or column_tile_size, mismatched N or D, NaN/inf entries, a
            negatives row count that is not a multiple of N, queue_size or queue_warmup < 0, a batch whose
            width differs from the queue's, an unknown similarity, direction, partition_mode, hardness_mode or
            margin_strategy, ``symmetric`` beside ``directions``/``partition_mode``, an option the tiles or the
            queue do not support, a guide that does not match the inputs.
        TypeError: a non-tensor or non-floating input, a non-int queue_size, directions given as one string, a
            guide that is not a tuple.

    Example:
        >>> loss_fn = InfoNCE(temperature=0.05, directions=("query_to_doc", "query_to_query"))
        >>> query, positive = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(query, positive, guide=(torch.randn(8, 16), torch.randn(8, 16)))
    """

    hyperparameters = ("temperature", "directions", "partition_mode", "similarity", "hardness_mode",
                       "hardness_strength", "margin_strategy", "margin", "tile_size", "column_tile_size", "queue_size")
    queue: EmbeddingQueue | None  # set by LossBase from queue_size

    def __init__(
        self, temperature: float = 0.05, *, symmetric: bool = False, tile_size: int | None = None,
        column_tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0, similarity: str = "cosine",
        directions: Sequence[str] | None = None, partition_mode: str | None = None, hardness_mode: str | None = None,
        hardness_strength: float = 0.0, margin_strategy: str = "absolute", margin: float = 0.0,
    ) -> None:
        super().__init__(temperature, tile_size=tile_size, column_tile_size=column_tile_size, queue_size=queue_size,
                         queue_warmup=queue_warmup)
        if symmetric and (directions is not None or partition_mode is not None):
            raise ValueError(
                f"symmetric=True is shorthand for directions={SYMMETRIC}, partition_mode='per_direction'; got "
                f"directions={directions!r}, partition_mode={partition_mode!r} beside it: pass one or the other"
            )
        if symmetric:
            directions, partition_mode = SYMMETRIC, "per_direction"
        self.directions = check_directions(("query_to_doc",) if directions is None else directions)
        self.partition_mode = check_partition_mode("joint" if partition_mode is None else partition_mode,
                                                   self.directions)
        self.symmetric = self.directions == SYMMETRIC and self.partition_mode == "per_direction"
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
        self.similarity = similarity
        self.hardness_mode, self.hardness_strength = check_hardness(hardness_mode, hardness_strength)
        self.margin_strategy, self.margin = check_margin_strategy(margin_strategy, margin)
        if self.tile_size is not None:
            self._check_tiled()
        if queue_size and self.hardness_mode is not None:
            raise ValueError(
                f"queue_size={queue_size} with hardness_mode={self.hardness_mode!r}: queued rows are neither "
                f"in-batch nor hard negatives; use one of the two"
            )

    def _check_tiled(self) -> None:
        """Raise ValueError naming the first option the tiled path does not compute."""
        unsupported = []
        if self.similarity != "cosine":
            unsupported.append(f"similarity={self.similarity!r}")
        if self.directions != ("query_to_doc",) and not self.symmetric:
            unsupported.append(f"directions={self.directions!r}, partition_mode={self.partition_mode!r}")
        if self.hardness_mode is not None:
            unsupported.append(f"hardness_mode={self.hardness_mode!r}")
        if unsupported:
            raise ValueError(
                f"tile_size={self.tile_size} supports cosine similarity with directions ('query_to_doc',) or "
                f"symmetric=True, without hardness_mode; got {', '.join(unsupported)}: use tile_size=None"
            )

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """n (1 + h) - 1 with the default directions: every document of the batch but the query's positive.

        Each direction adds the entries of its block that are not the positive pair (see ``directions.py``):
        query_to_query n - 1, doc_to_query n - 1, doc_to_doc (n - 1)(1 + h), positive_to_positive n - 1; joint,
        they all share query i's softmax. Per direction (``symmetric``), query i's softmax holds n (1 + h) - 1,
        the count returned, and positive i's (doc_to_query) n - 1. A guide drops some of them, batch by batch.
        """
        check_counts(self, seen, hard_negatives, takes_hard_negatives=True)
        if self.partition_mode == "per_direction":
            return negatives_of_pair("query_to_doc", seen, hard_negatives)
        return sum(negatives_of_pair(name, seen, hard_negatives) for name in self.directions)

    def forward(
        self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None, *,
        guide: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        inputs = {"query": query, "positive": positive}
        if negatives is not None:
            inputs["negatives"] = negatives
        check_embeddings(**inputs)
        n = check_same_rows(query=query, positive=positive)
        if negatives is not None and negatives.shape[0] % n != 0:
            raise ValueError(
                f"negatives has {negatives.shape[0]} rows, not a multiple of the {n} queries; pass h hard "
                f"negatives per query as an (N * h, D) tensor grouped by query"
            )
        hard_negatives = 0 if negatives is None else negatives.shape[0] // n
        guide_rows = None
        if guide is not None:
            if self.tile_size is not None or self.queue is not None:
                raise ValueError(
                    f"guide needs the dense loss without a queue, got tile_size={self.tile_size}, "
                    f"queue_size={self.queue_size}: queued rows have no guide embeddings; use tile_size=None and "
                    f"queue_size=0"
                )
            guide_rows = check_guide(guide, list(inputs.values()))
        dtype = compute_dtype(*inputs.values())
        with full_precision(query.device):
            scale = 1.0 / self.temperature
            # The candidates [positive; negatives; queue] stay apart: the tiled function stacks them tile by tile.
            candidates = [t.to(dtype) for t in inputs.values()][1:]
            queued = None if self.queue is None else self.queue.contents(candidates[0])  # (Q', D), constants
            columns = candidates if queued is None else [*candidates, queued]
            if self.tile_size is None:
                loss = self._dense(query, columns, scale, n, hard_negatives, dtype, guide_rows)
            else:
                loss = self._tiled(query.to(dtype), columns, scale)
        if self.queue is not None:
            self.queue.push(loss, *candidates)
        return loss

    def _dense(self, query: torch.Tensor, columns: list[torch.Tensor], scale: float, n: int, hard_negatives: int,
               dtype: torch.dtype, guide: list[torch.Tensor] | None) -> torch.Tensor:
        rows = unit_rows if self.similarity == "cosine" else (lambda x, d: x.to(d))
        similarities = score_blocks(rows(query, dtype), torch.cat([rows(c, dtype) for c in columns]), n,
                                    n * (1 + hard_negatives), self.directions)  # query_to_doc: (N, N(1+h) + Q')
        dropped = {} if guide is None else false_negatives(guide, self.directions, self.margin_strategy,
                                                           self.margin, dtype)
        logits = []
        for name, block in similarities.items():
            block_logits = block * scale  # (N, M)
            if name == "query_to_doc" and self.hardness_mode is not None:
                block_logits = block_logits + hardness_penalty(block, self.hardness_mode, self.hardness_strength,
                                                               hard_negatives)
            mask = excluded_pairs(name, n, hard_negatives, block.device)
            if name in dropped:
                mask = dropped[name] if mask is None else mask | dropped[name]
            logits.append(block_logits if mask is None else block_logits.masked_fill(mask, float("-inf")))
        # Column i of query_to_doc (and of doc_to_query) is the positive pair of row i.
        labels = torch.arange(n, device=query.device)
        if self.partition_mode == "joint":
            return F.cross_entropy(torch.cat(logits, dim=1), labels)  # (N, sum of the blocks' widths)
        return sum(F.cross_entropy(block_logits, labels) for block_logits in logits) / len(logits)

    def _tiled(self, query: torch.Tensor, candidates: list[torch.Tensor], scale: float) -> torch.Tensor:
        scale_tensor = torch.tensor(scale, dtype=query.dtype, device=query.device)
        targets = torch.arange(query.shape[0], device=query.device)
        # Column j < N is positive j scored against every query; hard negatives have no column term.
        query_losses, positive_losses = tiled_logsumexp(
            [query], candidates, scale_tensor, targets, self.tile_size, self.column_tile_size,
            with_columns=self.symmetric,
        )
        loss = query_losses.mean()
        if positive_losses is not None:
            loss = (loss + positive_losses.mean()) / 2
        return loss
