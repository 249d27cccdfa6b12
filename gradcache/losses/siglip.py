"""SigLIP's pairwise sigmoid loss with a learned temperature and bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase, check_counts
from .checks import check_embeddings, check_finite_number, check_same_rows
from .precision import compute_dtype, full_precision, unit_rows
from .queue import EmbeddingQueue, QueuePair
from .tiled_sigmoid import tiled_sigmoid_pair_loss

__all__ = ["SigLipLoss"]


class SigLipLoss(LossBase):
    """Independent binary classification of every (a_i, b_j) pair: matching on the diagonal, not elsewhere.

    L = -1/N sum_i sum_j log sigmoid(y_ij (a_i.b_j / t + bias)),  y_ij = +1 if i == j else -1, on unit vectors.

    With a queue (``queue_size`` > 0) each queued row is one more negative pair term per anchor, still over N:
    + 1/N (sum_i sum_q softplus(a_i.m^b_q / t + bias) + sum_q sum_j softplus(m^a_q.b_j / t + bias)).

    Paper: Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training", https://arxiv.org/abs/2303.15343.

    Args:
        temperature: initial t > 0; stored as ``logit_scale = log(1 / t)`` (the paper's t' = log 10 at t = 0.1).
        bias: initial bias b (the paper starts at -10 so the many negatives do not dominate early steps).
        learnable: make ``logit_scale`` and ``bias`` ``nn.Parameter``s (else buffers).
        tile_size: None for the dense (N, N) logits; an int to compute forward and backward in tiles of that
            many rows, memory O(tile_size * column_tile_size + N) above the embeddings and their gradients,
            same value and gradients (scale and bias included).
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles of ``tile_size``.
            At least the column count gives strips of ``tile_size`` rows against every column.
        queue_size: 0 for in-batch pairs only; Q > 0 to keep the last Q rows of ``a`` and of ``b`` of earlier
            calls, detached, in two queues: a_i against each queued b, each queued a against b_j, all negative
            pairs (label -1). It advances once per call with gradients on and a finite loss: once per step
            under GradCache, CachedLoss and FullBatch, once per micro-batch under NaiveAccumulation. See
            ``gradcache/losses/queue.py``.
        queue_warmup: calls with gradients before the queues are read or filled (XBM's warm-up); needs Q > 0.

    Shapes (``forward``):
        a: (N, D), e.g. images; b: (N, D), row i the pair of row i of ``a``.
        Returns a 0-dim tensor in float32 (float64 for float64 inputs).

    Raises:
        ValueError: temperature <= 0, non-finite bias, bad tile_size or column_tile_size, mismatched N or D,
            NaN/inf entries, queue_size or queue_warmup < 0, a batch whose width differs from the queues'.
        TypeError: a non-tensor or non-floating input, a non-int queue_size or queue_warmup.

    Example:
        >>> loss_fn = SigLipLoss(temperature=0.1, bias=-10.0)
        >>> a, b = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(a, b)
    """

    hyperparameters = ("temperature", "bias", "learnable", "tile_size", "column_tile_size", "queue_size")
    queue_names = ("a_queue", "b_queue")
    a_queue: EmbeddingQueue | None  # set by LossBase from queue_size, as b_queue; see ``queues``
    b_queue: EmbeddingQueue | None
    logit_scale: torch.Tensor  # log(1 / t), set by LossBase: a parameter if learnable, else a buffer
    bias: torch.Tensor  # registered as logit_scale is

    def __init__(
        self, temperature: float = 0.1, *, bias: float = -10.0, learnable: bool = True, tile_size: int | None = None,
        column_tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0,
    ) -> None:
        bias = check_finite_number(bias, "bias")
        super().__init__(temperature, tile_size=tile_size, column_tile_size=column_tile_size, queue_size=queue_size,
                         queue_warmup=queue_warmup, learnable=learnable)
        self.register_scalar("bias", bias)

    @property
    def queues(self) -> QueuePair:
        """``a_queue`` and ``b_queue`` as one ``QueuePair`` (first: a's rows; both None without a queue)."""
        return QueuePair(self.a_queue, self.b_queue)

    @property
    def temperature(self) -> float:
        """The current temperature, 1 / exp(logit_scale)."""
        return float(torch.exp(-self.logit_scale.detach()))

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """n - 1: each a_i forms a negative pair with every b_j, j != i (and b_j with every a_i, i != j)."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=False)
        return seen - 1

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_embeddings(a=a, b=b)
        n = check_same_rows(a=a, b=b)
        dtype = compute_dtype(a, b)
        a, b = a.to(dtype), b.to(dtype)
        queues = self.queues
        queued_a, queued_b = queues.contents(a, b)  # (Q', D) each, or None
        with full_precision(a.device):
            scale, bias = self.logit_scale.to(dtype).exp(), self.bias.to(dtype)
            total = self._pairs(a, b, scale, bias, paired=True)
            if queued_a is not None:
                total = total + self._pairs(a, queued_b, scale, bias, paired=False) + self._pairs(
                    queued_a, b, scale, bias, paired=False)
            loss = total / n
        queues.push(loss, a, b)
        return loss

    def _pairs(self, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
               paired: bool) -> torch.Tensor:
        """sum_ij softplus(-y_ij z_ij) over (N_a, D) x (N_b, D); y = +1 on the diagonal only if ``paired``."""
        if self.tile_size is not None:  # normalised inside, tile by tile
            return tiled_sigmoid_pair_loss(a, b, scale, bias, self.tile_size, self.column_tile_size, paired=paired)
        logits = unit_rows(a, a.dtype) @ unit_rows(b, b.dtype).T * scale + bias  # (N_a, N_b)
        labels = -torch.ones_like(logits)
        if paired:
            labels.diagonal().fill_(1.0)  # (N, N): +1 diagonal, -1 elsewhere
        return -F.logsigmoid(labels * logits).sum()
