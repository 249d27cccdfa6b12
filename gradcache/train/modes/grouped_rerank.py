"""The loss of `gradcache train text --kind cross-encoder`: the library's ListwiseRerank over the batches' groups of
(query, candidate) pairs, each query's positive first (data/text/rerank_groups.py)."""
from __future__ import annotations

import torch
from torch import nn

from gradcache.losses import ListwiseRerank


class GroupedRerank(nn.Module):
    """ListwiseRerank with Sigmoid over (M,) scores of M / G groups of G pairs, each query's positive first:

    L = -1/N sum_i log( exp(sigmoid(s_i0) / t) / sum_j exp(sigmoid(s_ij) / t) ),  j = 0 .. G - 1,

    sentence-transformers' cross-encoder (Cached)MultipleNegativesRankingLoss with scale = 1 / t and its default
    activation_fn (Sigmoid).
    """

    def __init__(self, group_size: int, temperature: float) -> None:
        super().__init__()
        self.group_size = group_size
        self.rerank = ListwiseRerank(temperature, activation=nn.Sigmoid())

    @property
    def temperature(self) -> float:
        return self.rerank.temperature

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """G - 1: every other pair of a query's group."""
        return self.group_size - 1

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return self.rerank(scores, self.group_size)
