"""Listwise reranking: cross-entropy of each query's positive against its group of candidates' scores."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradcache.ranges import check_int

from .base import LossBase, check_counts
from .precision import full_precision
from .rerank_scores import Activation, check_activation, checked_scores

__all__ = ["ListwiseRerank"]


class ListwiseRerank(LossBase):
    """Softmax cross-entropy over each query's group of 1 + k candidates, the first of the group the positive.

    L = -1/N sum_i log( exp(a(s_i0) / t) / sum_j exp(a(s_ij) / t) ),  j = 0 .. G - 1,  G = 1 + k,

    s_ij the score a cross-encoder gives query i's candidate j, a the ``activation`` (identity by default).

    Paper: Nogueira and Cho 2019 (BERT reranking), https://arxiv.org/abs/1901.04085; the localised contrastive
    estimation of Gao, Dai and Callan 2021, https://arxiv.org/abs/2101.08751 (a group of one positive and
    sampled negatives per query).

    sentence-transformers' cross-encoder ``(Cached)MultipleNegativesRankingLoss`` is this loss with
    ``activation=torch.nn.Sigmoid()`` and t = 1 / ``scale`` over groups it lays out column by column
    (``gradcache.integrations.sentence_transformers.GradCacheCrossEncoderLoss`` reorders them).

    Under GradCache the encoder is the cross-encoder, a (query, candidate) pair to one score: the cache holds the
    (M,) scores, so this loss sees every score of the batch, and chunks that cut a group in two are exact (each
    chunk's scores are its rows of the one (M,) batch the loss reads). Memory of the loss: O(M).

    Args:
        temperature: t > 0; divides the activated scores (sentence-transformers' ``scale`` = 1 / t).
        activation: None for the raw scores, or a callable applied to them before t (``torch.nn.Sigmoid()``);
            its parameters, if any, are trained with the loss's.

    Shapes (``forward(scores, group_size)``):
        scores: (M,) or (M, 1), M = N G, grouped by query: rows i G .. i G + G - 1 are query i's candidates, its
            positive first. group_size: G >= 2. Returns a 0-dim tensor in float32 (float64 for float64 scores).

    Raises:
        ValueError: temperature <= 0; group_size not an int >= 2, or M not a multiple of it; scores not (M,) or
            (M, 1), empty, or NaN/inf.
        TypeError: a non-callable activation; scores that are not a floating tensor.

    Example:
        >>> loss_fn = ListwiseRerank(temperature=0.1, activation=torch.nn.Sigmoid())
        >>> scores = torch.randn(8 * 5)  # 8 queries, each its positive then 4 negatives
        >>> loss = loss_fn(scores, group_size=5)
    """

    hyperparameters = ("temperature", "activation")

    def __init__(self, temperature: float = 1.0, *, activation: Activation | None = None) -> None:
        super().__init__(temperature, tile_size=None, column_tile_size=None, queue_size=0, queue_warmup=0)
        self.activation = check_activation(activation)

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """k = G - 1: the group's other candidates (``hard_negatives`` counts them); ``seen`` plays no part."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=True)
        return hard_negatives

    def forward(self, scores: torch.Tensor, group_size: int) -> torch.Tensor:
        scores = checked_scores(scores)
        groups = check_group_size(group_size, scores.shape[0])
        with full_precision(scores.device):
            if self.activation is not None:
                scores = self.activation(scores)
            logits = scores.reshape(groups, group_size) / self.temperature  # (N, G), column 0 the positive
            return F.cross_entropy(logits, torch.zeros(groups, dtype=torch.long, device=logits.device))


def check_group_size(group_size: object, rows: int) -> int:
    """The number of groups N = M / G; ValueError unless ``group_size`` is an int >= 2 dividing M."""
    check_int(group_size, "group_size", at_least=2, meaning="each query's positive and at least one negative")
    if rows % group_size:
        raise ValueError(
            f"got {rows} scores, not a multiple of group_size={group_size}: the scores must be whole groups, query i's "
            f"candidates at rows i * {group_size} .. i * {group_size} + {group_size - 1}, its positive first"
        )
    return rows // group_size
