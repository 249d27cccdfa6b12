"""SigLIP's pairwise sigmoid loss summed block by block, recomputing each block in backward.

    total = sum_ij softplus(-y_ij z_ij),  z_ij = s u_i . v_j + bias,  y_ij = +1 if i == j else -1

(softplus(-x) = -log sigmoid(x)), u and v the unit rows of the raw inputs, normalised block by block (see
``unit_blocks.py``). Unlike the softmax losses nothing couples the pairs, so forward keeps no statistics at all,
only the inputs; backward recomputes each (tile_size, column_tile_size) block and uses

    d total / d z_ij = -y_ij sigmoid(-y_ij z_ij).

Memory above the inputs and their gradients: two or three blocks, a few (block, D) rows and one partial sum per
block of a row strip; the (N, N) logits never exist. The sums over blocks are taken two levels deep (blocks of
a row strip, then strips), so float32 rounding grows with the number of strips, not of blocks. As in
``tiled_logsumexp``, logits are rounded as the dense loss rounds them, and d total / ds = sum_i u_i . (dz @ V)_i
costs O(t D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .precision import full_precision
from .unit_blocks import UnitBlocks, distinct_inputs, spans, to_input_gradients

__all__ = ["tiled_sigmoid_pair_loss"]


@dataclass(frozen=True)
class _Plan:
    parts: tuple[int, int]  # a and b as indices into the distinct inputs (one index if a is b)
    tile_size: int
    column_tile_size: int
    paired: bool  # row i and column i match (y_ii = +1); False: every pair is a negative (a queue's)


def _signed_logits(row_units: torch.Tensor, column_units: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                   row_start: int, column_start: int, paired: bool) -> torch.Tensor:
    """-y * logits of one block: (t, c)."""
    signed = (row_units @ column_units.T).mul_(scale).add_(bias)  # (t, c)
    if paired:  # matching pairs (global row == global column) have y = +1, so their sign flips
        signed.diagonal(offset=row_start - column_start).neg_()
    return signed


def _sum(partials: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.stack(partials).sum() if partials else torch.zeros_like(like)


def _forward(plan: _Plan, a: UnitBlocks, b: UnitBlocks, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    strips = []
    for row_start, row_stop in spans(a.count, plan.tile_size):
        row_units = a.block(row_start, row_stop)  # (t, D)
        strips.append(_sum([F.softplus(_signed_logits(row_units, b.block(column_start, column_stop), scale, bias,
                                                      row_start, column_start, plan.paired)).sum()
                            for column_start, column_stop in spans(b.count, plan.column_tile_size)], scale))
    return _sum(strips, scale)


def _backward(ctx: Any, grad_total: torch.Tensor) -> tuple:
    scale, bias, *tensors = ctx.saved_tensors
    plan: _Plan = ctx.plan
    need_scale, need_bias, need_inputs = ctx.needs_input_grad[1], ctx.needs_input_grad[2], ctx.needs_input_grad[3:]
    a, b = UnitBlocks(tensors, plan.parts[:1]), UnitBlocks(tensors, plan.parts[1:])
    grads = [torch.zeros_like(t) if need else None for t, need in zip(tensors, need_inputs)]
    need_a, need_b = grads[plan.parts[0]] is not None, grads[plan.parts[1]] is not None
    scale_strips, bias_strips = [], []
    for row_start, row_stop in spans(a.count, plan.tile_size):
        row_units = a.block(row_start, row_stop)  # (t, D)
        scaled_row_units = row_units * scale if need_b else None  # (t, D): d logits / d b
        row_part = torch.zeros_like(row_units) if (need_a or need_scale) else None  # (t, D): d total / d(s u)
        bias_blocks = []
        for column_start, column_stop in spans(b.count, plan.column_tile_size):
            column_units = b.block(column_start, column_stop)  # (c, D)
            # d softplus(-y z) / dz = -y sigmoid(-y z): sigmoid of the signed logit, negated on the diagonal.
            weights = _signed_logits(row_units, column_units, scale, bias, row_start, column_start,
                                     plan.paired).sigmoid_()
            if plan.paired:
                weights.diagonal(offset=row_start - column_start).neg_()
            weights.mul_(grad_total)  # (t, c)
            if need_b:
                b.add_product(grads, column_start, column_stop, weights.T, scaled_row_units)  # (c, D)
            if row_part is not None:
                row_part.addmm_(weights, column_units)
            if need_bias:
                bias_blocks.append(weights.sum())
            del weights
        if need_bias:
            bias_strips.append(_sum(bias_blocks, bias))
        if need_scale:
            scale_strips.append((row_units * row_part).sum())
        if need_a:
            a.add(grads, row_start, row_stop, row_part.mul_(scale))
    to_input_gradients(tensors, grads, plan.tile_size)
    grad_scale = _sum(scale_strips, scale) if need_scale else None
    grad_bias = _sum(bias_strips, bias) if need_bias else None
    return (None, grad_scale, grad_bias, *grads)


class _TiledSigmoidPairLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: _Plan, scale: torch.Tensor, bias: torch.Tensor,  # type: ignore[override]
                *tensors: torch.Tensor) -> torch.Tensor:
        with full_precision(scale.device):
            total = _forward(plan, UnitBlocks(tensors, plan.parts[:1]), UnitBlocks(tensors, plan.parts[1:]),
                             scale, bias)
        ctx.save_for_backward(scale, bias, *tensors)
        ctx.plan, ctx.device = plan, scale.device
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple:
        # A backward called inside autocast must not drop the blocks to half precision.
        with full_precision(ctx.device):
            return _backward(ctx, grad_total)


def tiled_sigmoid_pair_loss(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                            tile_size: int, column_tile_size: int | None = None, paired: bool = True) -> torch.Tensor:
    """Sum over all N x N pairs of -log sigmoid(y_ij (s u_i . v_j + bias)), u, v the unit rows, in blocks.

    Memory O(tile_size * column_tile_size + N) above the inputs and their gradients.

    Args:
        a: (N, D) and b: (N, D) raw tensors in the compute dtype, normalised inside; row i of each is a pair.
        scale: 0-dim tensor s; bias: 0-dim tensor; both get gradients if they require them.
        tile_size: rows per block (>= 1; the loss checks it).
        column_tile_size: columns per block; None for ``tile_size``; N or more gives one strip per row block.
        paired: True: y_ii = +1 (row i of a pairs with row i of b, same N); False: y = -1 everywhere, for a
            (N, D) against an (M, D) of queued negatives.

    Returns:
        0-dim tensor: the sum (not the mean) over all pairs; SigLipLoss divides by N.
    """
    tensors, (a_part, b_part) = distinct_inputs((a,), (b,))
    plan = _Plan((a_part[0], b_part[0]), tile_size, column_tile_size or tile_size, paired)
    return _TiledSigmoidPairLoss.apply(plan, scale, bias, *tensors)
