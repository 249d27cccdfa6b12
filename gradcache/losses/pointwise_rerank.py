"""Pointwise reranking: binary cross-entropy of each (query, candidate) pair's score against its label."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradcache.ranges import is_finite

from .base import LossBase, check_counts
from .precision import full_precision
from .rerank_scores import Activation, check_activation, checked_scores

__all__ = ["PointwiseRerank"]


class PointwiseRerank(LossBase):
    """Binary cross-entropy with logits of every pair's score against its relevance label in [0, 1].

    L = -1/M sum_j [ w y_j log sigma(z_j) + (1 - y_j) log(1 - sigma(z_j)) ],  z_j = a(s_j) / t,

    s_j the score a cross-encoder gives pair j, a the ``activation`` (identity by default), w ``pos_weight``.

    Paper: Nogueira and Cho 2019 (BERT reranking, pointwise), https://arxiv.org/abs/1901.04085.

    sentence-transformers' cross-encoder ``BinaryCrossEntropyLoss`` is this loss (its ``activation_fn`` is
    ``activation``, its ``pos_weight`` the same, t = 1).

    Each pair's term is its own, so under GradCache any chunking is exact, groups cut in two included.

    Args:
        temperature: t > 0; divides the activated scores (1: sentence-transformers' loss).
        activation: None for the raw scores, or a callable applied to them before t.
        pos_weight: w > 0, the weight of the positive term (None: 1), as ``torch.nn.BCEWithLogitsLoss``'s.

    Shapes (``forward(scores, labels)``):
        scores: (M,) or (M, 1); labels: M floats (or ints, bools) in [0, 1], in the scores' order. Returns a 0-dim
        tensor in float32 (float64 for float64 scores).

    Raises:
        ValueError: temperature <= 0, pos_weight <= 0; scores not (M,) or (M, 1), empty or NaN/inf; labels of
            another count or outside [0, 1].
        TypeError: a non-callable activation; scores or labels that are not tensors, non-floating scores.

    Example:
        >>> loss_fn = PointwiseRerank()
        >>> loss = loss_fn(torch.randn(6), labels=torch.tensor([1.0, 0, 0, 1, 0, 0]))
    """

    hyperparameters = ("temperature", "activation", "pos_weight")

    def __init__(self, temperature: float = 1.0, *, activation: Activation | None = None,
                 pos_weight: float | None = None) -> None:
        super().__init__(temperature, tile_size=None, column_tile_size=None, queue_size=0, queue_warmup=0)
        self.activation = check_activation(activation)
        if pos_weight is not None and (not is_finite(pos_weight) or pos_weight <= 0):
            raise ValueError(f"pos_weight must be None or a finite number > 0, got {pos_weight!r}")
        self.pos_weight = None if pos_weight is None else float(pos_weight)

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """0: each pair is scored against its label alone, never contrasted with another."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=True)
        return 0

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        scores = checked_scores(scores)
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"labels must be a torch.Tensor of M values in [0, 1], got {type(labels).__name__}")
        if labels.numel() != scores.shape[0]:
            raise ValueError(
                f"labels has {labels.numel()} values for {scores.shape[0]} scores; give one label per pair, in the "
                "scores' order"
            )
        targets = labels.reshape(-1).to(device=scores.device, dtype=scores.dtype)
        if bool(((targets < 0) | (targets > 1) | ~torch.isfinite(targets)).any()):
            raise ValueError("labels must lie in [0, 1] (1 relevant, 0 not; a probability in between)")
        with full_precision(scores.device):
            if self.activation is not None:
                scores = self.activation(scores)
            weight = None if self.pos_weight is None else scores.new_tensor(self.pos_weight)
            return F.binary_cross_entropy_with_logits(scores / self.temperature, targets, pos_weight=weight)
