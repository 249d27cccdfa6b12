"""SigLIP's pairwise sigmoid loss summed strip by strip, recomputing each strip in backward.

    total = sum_ij softplus(-y_ij z_ij),  z_ij = s a_i . b_j + bias,  y_ij = +1 if i == j else -1

(softplus(-x) = -log sigmoid(x)). Unlike the softmax losses nothing couples the rows, so forward keeps no
statistics at all, only the inputs; backward recomputes each (tile_size, N) strip and uses

    d total / d z_ij = -y_ij sigmoid(-y_ij z_ij).

Peak memory is two or three (tile_size, N) strips plus the inputs; the (N, N) logits never exist. As in
``tiled_logsumexp``, logits are rounded as the dense loss rounds them, and d total / ds = sum_i a_i . (dz @ B)_i
costs O(t D).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .precision import full_precision

__all__ = ["tiled_sigmoid_pair_loss"]


def _strip_signed_logits(
    a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, start: int, stop: int
) -> torch.Tensor:
    """-y * logits for rows start..stop of a against all of b: (t, N)."""
    signed = (a[start:stop] @ b.T).mul_(scale).add_(bias)  # (t, N)
    # Matching pairs (row start + r, column start + r) have y = +1, so their sign flips.
    signed.diagonal(offset=start).neg_()
    return signed


def _forward(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, tile_size: int) -> torch.Tensor:
    total = torch.zeros((), dtype=a.dtype, device=a.device)
    for start in range(0, a.shape[0], tile_size):
        stop = min(start + tile_size, a.shape[0])
        total += F.softplus(_strip_signed_logits(a, b, scale, bias, start, stop)).sum()
    return total


def _backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    a, b, scale, bias = ctx.saved_tensors
    need_a, need_b, need_scale, need_bias = ctx.needs_input_grad[:4]
    scaled_a = a * scale  # (N, D): d logits / d b, one row per strip row
    grad_a = torch.zeros_like(a) if need_a else None
    grad_b = torch.zeros_like(b) if need_b else None
    grad_scale = torch.zeros_like(scale) if need_scale else None
    grad_bias = torch.zeros_like(bias) if need_bias else None
    for start in range(0, a.shape[0], ctx.tile_size):
        stop = min(start + ctx.tile_size, a.shape[0])
        # d softplus(-y z) / dz = -y sigmoid(-y z): sigmoid of the signed logit, negated on the diagonal.
        weights = _strip_signed_logits(a, b, scale, bias, start, stop).sigmoid_()  # (t, N)
        weights.diagonal(offset=start).neg_()
        weights.mul_(grad_total)
        if grad_b is not None:
            grad_b.addmm_(weights.T, scaled_a[start:stop])  # (N, D)
        if grad_a is not None or grad_scale is not None:
            row_part = weights @ b  # (t, D): d total / d(scaled row)
            if grad_a is not None:
                grad_a[start:stop] = row_part * scale
            if grad_scale is not None:
                grad_scale += (a[start:stop] * row_part).sum()
        if grad_bias is not None:
            grad_bias += weights.sum()
        del weights
    return grad_a, grad_b, grad_scale, grad_bias, None


class _TiledSigmoidPairLoss(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, tile_size: int
    ) -> torch.Tensor:
        with full_precision(a.device):
            total = _forward(a, b, scale, bias, tile_size)
        ctx.save_for_backward(a, b, scale, bias)
        ctx.tile_size, ctx.device = tile_size, a.device
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple:
        # A backward called inside autocast must not drop the strips to half precision.
        with full_precision(ctx.device):
            return _backward(ctx, grad_total)


def tiled_sigmoid_pair_loss(
    a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, tile_size: int
) -> torch.Tensor:
    """Sum over all N x N pairs of -log sigmoid(y_ij (s a_i . b_j + bias)), in strips of ``tile_size`` rows.

    Args:
        a: (N, D) and b: (N, D) tensors, already normalised and in the compute dtype; row i of each is a pair.
        scale: 0-dim tensor s; bias: 0-dim tensor; both get gradients if they require them.
        tile_size: rows per strip (>= 1; the loss checks it).

    Returns:
        0-dim tensor: the sum (not the mean) over all pairs; SigLipLoss divides by N.
    """
    return _TiledSigmoidPairLoss.apply(a, b, scale, bias, tile_size)
