"""The loss of `gradcache train text` (the dense kind and those built on it): the library's InfoNCE over the text
batches' layout, each query's passages grouped after it, positive first (data/text/batches.py)."""
from __future__ import annotations

import torch
from torch import nn

from gradcache import losses
from gradcache.train.data.text.batches import split_groups


class GroupedInfoNCE(nn.Module):
    """InfoNCE(query (n, D), passages (n (1 + h), D) grouped by query, positive first): every query against every
    positive and hard negative of the batch, over all ranks when the strategy gathers them.

    L = -1/n sum_i log( exp(q_i.p_i / t) / (sum_j exp(q_i.p_j / t) + sum_k exp(q_i.n_k / t)) ), on unit vectors,

    p_j = passages[j (1 + h)], n_k the others (gradcache.losses.InfoNCE over `split_groups`, data/text/batches.py).

    With a guide (GISTEmbed, `--guide`): `guide_query` (n, D') and `guide_passages` (n (1 + h), D'), the guide
    model's embeddings of the same texts, drop from each query's softmax the candidates the guide scores above
    g(q_i, p_i) - margin (`margin_strategy` "absolute") or g(q_i, p_i) - |g(q_i, p_i)| margin ("relative").
    `infonce` is the InfoNCE, or a `Matryoshka` around it (`--matryoshka-dims`)."""

    def __init__(self, negatives_per_query: int, temperature: float, *, symmetric: bool = False,
                 tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0,
                 margin_strategy: str = "absolute", margin: float = 0.0) -> None:
        super().__init__()
        self.negatives_per_query = negatives_per_query
        self.infonce = losses.InfoNCE(temperature=temperature, symmetric=symmetric, tile_size=tile_size,
                                      queue_size=queue_size, queue_warmup=queue_warmup,
                                      margin_strategy=margin_strategy, margin=margin)

    @property
    def temperature(self) -> float:
        inner = self.infonce.loss if isinstance(self.infonce, losses.Matryoshka) else self.infonce
        return inner.temperature

    def forward(self, query: torch.Tensor, passages: torch.Tensor, guide_query: torch.Tensor | None = None,
                guide_passages: torch.Tensor | None = None) -> torch.Tensor:
        if passages.shape[0] != query.shape[0] * (1 + self.negatives_per_query):
            raise ValueError(f"passages must hold {1 + self.negatives_per_query} rows per query (positive and "
                             f"{self.negatives_per_query} hard negatives), got {passages.shape[0]} for "
                             f"{query.shape[0]} queries")
        positive, negatives = split_groups(passages, self.negatives_per_query)  # (n, D), (n h, D) or None
        if guide_query is None:
            return self.infonce(query, positive, negatives)
        guide_positive, guide_negatives = split_groups(guide_passages, self.negatives_per_query)  # (n, D'), ...
        guide = (guide_query, guide_positive) + (() if guide_negatives is None else (guide_negatives,))
        return self.infonce(query, positive, negatives, guide=guide)


def grouped_matryoshka(loss: GroupedInfoNCE, dims: list[int]) -> GroupedInfoNCE:
    """`loss` with the InfoNCE inside the grouping summed over `dims` (`--matryoshka-dims`): it is handed the
    positives and hard negatives as they are split from the passages, so a queue keeps one full-width copy of
    exactly those rows."""
    loss.infonce = losses.Matryoshka(loss.infonce, dims)
    return loss
