"""Held-out retrieval by sparse rows (`--kind sparse`): each query's row against every corpus row, by dot product.

The corpus and the relevant passage are the dense kind's (gradcache/train/eval/retrieval.py): the distinct
held-out positives and hard negatives, or `--corpus`. With s_c = <q, d_c> computed from the non-zeros (float64)
and p the query's positive, its 1-based rank is

    r = 1 + #{c : s_c > s_p} + #{c < p : s_c = s_p}          (ties go to the earlier corpus passage)

and, averaged over queries, in percent: recall@k = [r <= k], mrr@10 = [r <= 10] / r, ndcg@10 = [r <= 10] /
log2(r + 1), under the dense kind's keys `recall@1`, `recall@10`, `mrr@10`, `ndcg@10`. Beside them, the mean
number of non-zeros of a query row and of a corpus row: `nonzeros_per_query`, `nonzeros_per_document` (counts,
not percentages), which is what an inverted index of the rows costs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.retrieval import RETRIEVAL_DEPTH, retrieval_corpus
from gradcache.train.outputs.sparse_rows import CsrRows

QUERY_BATCH = 256  # query rows scored against the corpus at once: (C, 256) float64 scores


@torch.no_grad()
def embed_sparse_texts(encode: Callable[..., torch.Tensor], tokenizer: Callable, texts: Sequence[str],
                       device: torch.device, batch_size: int = 256) -> CsrRows:
    """The (N, V) rows of `texts` in their order, encoded in batches of similar length (sorted by characters, so
    a batch pads little: a padding token adds nothing to a SPLADE row), kept by their non-zeros batch by batch."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    parts, width = [], 0
    for start in range(0, len(order), batch_size):
        tokens = tokenizer([texts[i] for i in order[start:start + batch_size]])
        rows = encode(**{key: value.to(device) for key, value in tokens.items()})  # (b, V)
        parts.append(CsrRows.from_dense(rows))
        width = rows.shape[1]
    sorted_rows = CsrRows.stacked(parts, width)
    return sorted_rows.taken(np.argsort(order, kind="stable"))  # back to the texts' order


def sparse_ranks(queries: CsrRows, corpus: CsrRows, relevant: np.ndarray) -> np.ndarray:
    """(Q,) the rank r of each query's relevant corpus row (module docstring), scored from the non-zeros."""
    if len(relevant) != queries.shape[0] or (len(relevant) and (relevant.min() < 0
                                                                or relevant.max() >= corpus.shape[0])):
        raise ValueError(f"relevant must hold one corpus index in [0, {corpus.shape[0]}) per query "
                         f"({queries.shape[0]}), got {len(relevant)} values")
    documents = corpus.to_torch()  # (C, V) sparse
    positions = torch.arange(corpus.shape[0])  # (C,)
    ranks = []
    for start in range(0, queries.shape[0], QUERY_BATCH):
        order = np.arange(start, min(start + QUERY_BATCH, queries.shape[0]))
        batch = queries.taken(order).to_torch().to_dense()  # (b, V)
        scores = torch.sparse.mm(documents, batch.T).T  # (b, C)
        target = torch.from_numpy(relevant[order])  # (b,)
        own = scores.gather(1, target[:, None])  # (b, 1)
        earlier = positions[None, :] < target[:, None]  # (b, C)
        ranks.append(1 + (scores > own).sum(1) + ((scores == own) & earlier).sum(1))
    return torch.cat(ranks).numpy() if ranks else np.zeros(0, np.int64)


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """recall@1, recall@10, mrr@10 and ndcg@10 (%) of the 1-based ranks of the relevant passages."""
    found = ranks <= RETRIEVAL_DEPTH
    return {
        "recall@1": 100.0 * float((ranks == 1).mean()),
        "recall@10": 100.0 * float(found.mean()),
        "mrr@10": 100.0 * float(np.where(found, 1.0 / ranks, 0.0).mean()),
        "ndcg@10": 100.0 * float(np.where(found, 1.0 / np.log2(ranks + 1.0), 0.0).mean()),
    }


def sparse_metrics(queries: CsrRows, corpus: CsrRows, relevant: np.ndarray) -> dict[str, float]:
    """The metrics of the module docstring for query and corpus rows and (Q,) the relevant corpus indices."""
    return {**rank_metrics(sparse_ranks(queries, corpus, relevant)),
            "nonzeros_per_query": float(queries.nonzeros_per_row().mean()),
            "nonzeros_per_document": float(corpus.nonzeros_per_row().mean())}


def evaluate_sparse_retrieval(encode_query: Callable[..., torch.Tensor], encode_passage: Callable[..., torch.Tensor],
                              query_tokenizer: Callable, passage_tokenizer: Callable, pairs: TextPairs,
                              device: torch.device, corpus: tuple[Sequence[str], np.ndarray] | None = None,
                              batch_size: int = 256) -> dict[str, float]:
    """The held-out queries of `pairs` against their corpus (or `corpus`: passages and (Q,) the place of each
    query's positive among them), each text encoded into its sparse row by its side's tower and tokenizer."""
    texts, relevant = retrieval_corpus(pairs) if corpus is None else corpus
    queries = embed_sparse_texts(encode_query, query_tokenizer, pairs.queries, device, batch_size)
    passages = embed_sparse_texts(encode_passage, passage_tokenizer, texts, device, batch_size)
    return sparse_metrics(queries, passages, relevant)
