"""Held-out retrieval with faiss: each query against a corpus of every held-out positive and hard negative.

The corpus is the DISTINCT passages of the held-out rows (a passage that is one row's positive and another's
hard negative is one candidate), so each query has exactly one relevant passage, its own positive. With r the
1-based rank of that passage among the corpus by cosine similarity, averaged over queries, in percent:

    recall@k = [r <= k]        mrr@10 = [r <= 10] / r        ndcg@10 = [r <= 10] / log2(r + 1)

(ndcg's ideal DCG is 1 with one relevant passage). Key names: `recall@1`, `recall@10`, `mrr@10`, `ndcg@10`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import faiss
import numpy as np
import torch

from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.dimensions import at_dim, evaluation_dims, truncated
from gradcache.train.eval.embed import embed_texts

RETRIEVAL_DEPTH = 10


def retrieval_corpus(pairs: TextPairs) -> tuple[list[str], np.ndarray]:
    """The distinct positives and hard negatives of `pairs`, and (N,) the corpus index of each row's positive."""
    index: dict[str, int] = {}
    for positive, negatives in zip(pairs.positives, pairs.negatives):
        for passage in (positive, *negatives):
            index.setdefault(passage, len(index))
    return list(index), np.array([index[positive] for positive in pairs.positives], dtype=np.int64)


def retrieval_metrics(query_embeddings: np.ndarray, corpus_embeddings: np.ndarray,
                      relevant: np.ndarray) -> dict[str, float]:
    """recall@1, recall@10, mrr@10 and ndcg@10 (%) of (Q, D) queries over a (C, D) corpus; `relevant` (Q,) indices.

    Embeddings are ranked by inner product: pass L2-normalised ones for cosine similarity.
    """
    if len(relevant) != len(query_embeddings) or relevant.min() < 0 or relevant.max() >= len(corpus_embeddings):
        raise ValueError(f"relevant must hold one corpus index in [0, {len(corpus_embeddings)}) per query "
                         f"({len(query_embeddings)}), got {len(relevant)} values in "
                         f"[{relevant.min()}, {relevant.max()}]")
    search = faiss.IndexFlatIP(corpus_embeddings.shape[1])
    search.add(np.ascontiguousarray(corpus_embeddings, dtype=np.float32))
    depth = min(RETRIEVAL_DEPTH, len(corpus_embeddings))
    _, ranked = search.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), depth)  # (Q, depth)
    hits = ranked == relevant[:, None]  # (Q, depth), at most one True per row
    found = hits.any(axis=1)
    rank = np.where(found, hits.argmax(axis=1) + 1, 0)  # 1-based rank within the top `depth`, 0 = not found
    safe_rank = np.maximum(rank, 1)  # the not-found rows are masked out; this keeps them from dividing by 0
    reciprocal = np.where(found, 1.0 / safe_rank, 0.0)
    gain = np.where(found, 1.0 / np.log2(safe_rank + 1.0), 0.0)
    return {
        "recall@1": 100.0 * float((found & (rank == 1)).mean()),
        "recall@10": 100.0 * float(found.mean()),
        "mrr@10": 100.0 * float(reciprocal.mean()),
        "ndcg@10": 100.0 * float(gain.mean()),
    }


def evaluate_retrieval(encode_query: Callable[..., torch.Tensor], encode_passage: Callable[..., torch.Tensor],
                       tokenizer: Callable, pairs: TextPairs, device: torch.device,
                       batch_size: int = 256, dims: Sequence[int] | None = None,
                       corpus: tuple[Sequence[str], np.ndarray] | None = None,
                       passage_tokenizer: Callable | None = None) -> dict[str, float]:
    """The held-out queries of `pairs` against their corpus, each text embedded by its tower (module docstring);
    with `dims` (`--matryoshka-dims`), the same metrics at each narrower width d as `<metric>@<d>`. `corpus`
    (`--corpus`): the passages to rank instead, and (Q,) the place of each query's positive among them.
    `passage_tokenizer`: the passages' own (their prompt), default `tokenizer`."""
    corpus, relevant = retrieval_corpus(pairs) if corpus is None else corpus
    queries = embed_texts(encode_query, tokenizer, pairs.queries, device, batch_size)
    passages = embed_texts(encode_passage, tokenizer if passage_tokenizer is None else passage_tokenizer, corpus,
                           device, batch_size)
    metrics = retrieval_metrics(queries, passages, relevant)
    for dim in evaluation_dims(dims, queries.shape[1]):
        metrics.update(at_dim(retrieval_metrics(truncated(queries, dim), truncated(passages, dim), relevant), dim))
    return metrics
