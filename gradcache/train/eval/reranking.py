"""Held-out reranking: a cross-encoder scores each held-out query against its candidates, and ranks them.

Query i's candidates are its positive, its hard negatives (distinct, other than the positive) and
`RERANK_OTHERS` other passages of the held-out rows (the distinct positives and hard negatives of every held-out
row, as the dense retrieval's corpus), drawn without replacement among those not already its candidates by a
generator seeded with the run's --data-seed, query after query (`rerank_candidates`): the same candidates at every
evaluation of a run, and for every run of the same held-out rows. With r = 1 + the number of other candidates
scored at least as high as the positive (ties count against it), averaged over queries, in percent:

    recall@k = [r <= k]        mrr@10 = [r <= 10] / r        ndcg@10 = [r <= 10] / log2(r + 1)

keyed as the dense retrieval keys them: `recall@1`, `recall@10`, `mrr@10`, `ndcg@10`. The ranking reads the raw
logits (Sigmoid, which `CrossEncoder.predict` applies, keeps their order but rounds large ones to a tie at 1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.retrieval import RETRIEVAL_DEPTH, retrieval_corpus

RERANK_OTHERS = 20  # held-out passages drawn into each query's candidates beside its own


def rerank_candidates(pairs: TextPairs, seed: int, others: int = RERANK_OTHERS) -> list[list[str]]:
    """Each query's candidates, its positive first (module docstring): min(others, what the pool has left) drawn."""
    pool, _ = retrieval_corpus(pairs)
    place = {text: k for k, text in enumerate(pool)}
    generator = torch.Generator().manual_seed(seed)
    candidates = []
    for positive, negatives in zip(pairs.positives, pairs.negatives):
        own = list(dict.fromkeys((positive, *negatives)))  # distinct, the positive first
        taken = {place[text] for text in own}
        wanted = min(others, len(pool) - len(taken))
        drawn: list[int] = []
        while len(drawn) < wanted:  # rejection: O(others) per query, however large the pool
            for k in torch.randint(len(pool), (2 * wanted,), generator=generator).tolist():
                if k not in taken and len(drawn) < wanted:
                    taken.add(k)
                    drawn.append(k)
        candidates.append(own + [pool[k] for k in drawn])
    return candidates


@torch.no_grad()
def score_pairs(scorer: Callable[[list[tuple[str, str]]], torch.Tensor], pairs: Sequence[tuple[str, str]],
                batch_size: int = 256) -> np.ndarray:
    """(P,) float32 raw scores (logits) of `pairs` in their order, scored in batches of similar length."""
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    scores = torch.empty(len(pairs))
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        scores[torch.tensor(batch)] = scorer([pairs[i] for i in batch]).float().cpu()
    return scores.numpy()


def rerank_metrics(scores: Sequence[np.ndarray]) -> dict[str, float]:
    """recall@1, recall@10, mrr@10 and ndcg@10 (%) of each query's (G_i,) candidate scores, the positive's first."""
    rank = np.array([1 + int((row[1:] >= row[0]).sum()) for row in scores])  # (Q,), ties against the positive
    found = rank <= RETRIEVAL_DEPTH
    return {
        "recall@1": 100.0 * float((rank == 1).mean()),
        "recall@10": 100.0 * float(found.mean()),
        "mrr@10": 100.0 * float(np.where(found, 1.0 / rank, 0.0).mean()),
        "ndcg@10": 100.0 * float(np.where(found, 1.0 / np.log2(rank + 1.0), 0.0).mean()),
    }


def evaluate_reranking(scorer: Callable[[list[tuple[str, str]]], torch.Tensor], pairs: TextPairs, seed: int,
                       batch_size: int = 256) -> dict[str, float]:
    """The held-out queries of `pairs`, each reranking its candidates by `scorer`'s scores (module docstring);
    `scorer` (a `PairScorer`) tokenises each batch and moves it to its own device."""
    candidates = rerank_candidates(pairs, seed)
    flat = [(query, text) for query, texts in zip(pairs.queries, candidates) for text in texts]
    scores = score_pairs(scorer, flat, batch_size)
    ends = np.cumsum([len(texts) for texts in candidates])[:-1]
    return rerank_metrics(np.split(scores, ends))
