"""Held-out retrieval by MaxSim (`--kind multi-vector`): each query's token vectors against every passage of the
corpus that the dense kind ranks (gradcache/train/eval/retrieval.py: the distinct held-out positives and hard
negatives, or `--corpus`), exhaustively.

s(q, d) = sum_i max_j <q_i, d_j>, over the query's scored tokens i and the passage's scored tokens j (the masks the
model returns). With r = 1 + #{passages scored above the query's own positive} (a tie counts in the positive's
favour), averaged over queries, in percent, under the dense kind's keys:

    recall@k = [r <= k]        mrr@10 = [r <= 10] / r        ndcg@10 = [r <= 10] / log2(r + 1)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gradcache.token_embeddings import TokenEmbeddings
from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.retrieval import RETRIEVAL_DEPTH, retrieval_corpus

SCORE_BLOCK = 2**24  # token similarities computed at once (queries x passages x Lq x Ld), 64 MiB of float32


@torch.no_grad()
def embed_token_texts(encode: Callable[..., TokenEmbeddings], tokenizer: Callable, texts: Sequence[str],
                      device: torch.device, batch_size: int = 256) -> list[torch.Tensor]:
    """Each text's scored token vectors, (n_i, D) float32 on the CPU, in the texts' order (encoded in batches of
    similar length): `values[mask]` of the `TokenEmbeddings` the model returns, as `MultiVectorEncoder.encode`."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[torch.Tensor | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        tokens = tokenizer([texts[i] for i in rows])
        embedded = encode(**{key: value.to(device) for key, value in tokens.items()})
        values, mask = embedded.values.float().cpu(), embedded.mask.cpu()
        for k, i in enumerate(rows):
            out[i] = values[k][mask[k]]
    return out  # type: ignore[return-value]  # every slot filled


def padded(vectors: Sequence[torch.Tensor]) -> TokenEmbeddings:
    """(n_i, D) token vectors as TokenEmbeddings (N, max n_i, D) padded with zeros, mask True on the real ones."""
    longest = max(len(v) for v in vectors)
    values = torch.zeros(len(vectors), longest, vectors[0].shape[1], dtype=vectors[0].dtype)
    mask = torch.zeros(len(vectors), longest, dtype=torch.bool)
    for k, v in enumerate(vectors):
        values[k, :len(v)], mask[k, :len(v)] = v, True
    return TokenEmbeddings(values, mask)


def maxsim_scores(queries: Sequence[torch.Tensor], passages: Sequence[torch.Tensor],
                  device: torch.device | None = None) -> torch.Tensor:
    """(Q, C) MaxSim scores s(q, d) (module docstring) of (n_i, D) query and passage token vectors, computed on
    `device` (default: the CPU) in blocks of queries so that at most `SCORE_BLOCK` token similarities exist at
    once; returned on the CPU."""
    corpus = TokenEmbeddings(*(t.to(device) for t in padded(passages)))  # (C, Ld, D)
    query_tokens = TokenEmbeddings(*(t.to(device) for t in padded(queries)))  # (Q, Lq, D)
    per_query = corpus.values.shape[0] * corpus.values.shape[1] * query_tokens.values.shape[1]
    block = max(1, SCORE_BLOCK // max(per_query, 1))
    scores = []
    for start in range(0, len(queries), block):
        values = query_tokens.values[start:start + block]  # (b, Lq, D)
        similarities = torch.einsum("aid,bjd->abij", values, corpus.values)  # (b, C, Lq, Ld)
        best = similarities.masked_fill(~corpus.mask[None, :, None, :], float("-inf")).amax(dim=3)  # (b, C, Lq)
        weights = query_tokens.mask[start:start + block, None, :]  # (b, 1, Lq)
        scores.append(best.masked_fill(~weights, 0.0).sum(dim=2).cpu())  # (b, C)
    return torch.cat(scores)


def ranked_metrics(scores: torch.Tensor, relevant: np.ndarray) -> dict[str, float]:
    """recall@1, recall@10, mrr@10 and ndcg@10 (%) of (Q, C) scores, `relevant` (Q,) the corpus index of each
    query's one relevant passage; r as the module docstring counts it."""
    relevant_t = torch.as_tensor(relevant, dtype=torch.long)
    if len(relevant_t) != scores.shape[0] or relevant_t.min() < 0 or relevant_t.max() >= scores.shape[1]:
        raise ValueError(f"relevant must hold one corpus index in [0, {scores.shape[1]}) per query "
                         f"({scores.shape[0]}), got {len(relevant_t)} values")
    own = scores.gather(1, relevant_t[:, None])  # (Q, 1)
    rank = 1 + (scores > own).sum(dim=1).double()  # (Q,)
    found = rank <= RETRIEVAL_DEPTH
    return {
        "recall@1": 100.0 * float((rank == 1).double().mean()),
        "recall@10": 100.0 * float(found.double().mean()),
        "mrr@10": 100.0 * float(torch.where(found, 1.0 / rank, 0.0).mean()),
        "ndcg@10": 100.0 * float(torch.where(found, 1.0 / torch.log2(rank + 1.0), 0.0).mean()),
    }


def evaluate_maxsim_retrieval(encode_query: Callable[..., TokenEmbeddings],
                              encode_passage: Callable[..., TokenEmbeddings], tokenizer: Callable, pairs: TextPairs,
                              device: torch.device, batch_size: int = 256,
                              corpus: tuple[Sequence[str], np.ndarray] | None = None,
                              passage_tokenizer: Callable | None = None) -> dict[str, float]:
    """The held-out queries of `pairs` against their corpus by MaxSim (module docstring). `corpus` (`--corpus`):
    the passages to rank instead, and (Q,) the place of each query's positive among them; `passage_tokenizer`:
    the passages' own (their prompt), default `tokenizer`."""
    corpus, relevant = retrieval_corpus(pairs) if corpus is None else corpus
    queries = embed_token_texts(encode_query, tokenizer, pairs.queries, device, batch_size)
    passages = embed_token_texts(encode_passage, tokenizer if passage_tokenizer is None else passage_tokenizer,
                                 corpus, device, batch_size)
    return ranked_metrics(maxsim_scores(queries, passages, device), relevant)
