"""Per-row (and per-column) cross-entropy of scaled cosine similarities, in blocks: no N x M matrix ever exists.

    row_i = log sum_j exp(l_ij) - l_{i,t_i},   col_j = log sum_i exp(l_ij) - l_jj,   l_ij = s u_i . v_j

i.e. each row's (column's) log-sum-exp minus its target logit: that row's cross-entropy, with u, v the unit rows
of the raw inputs (normalised block by block, see ``unit_blocks.py``). Forward walks blocks of ``tile_size``
rows x ``column_tile_size`` columns and keeps, as flash attention keeps its softmax statistics, a running max
and a running sum of exp(l - max) per row (across the column blocks of a row block) and per column (across row
blocks), each sum rescaled by exp(old max - new max) when its max grows. The target logit is subtracted from
the max, not from the rounded log-sum-exp, so a small loss keeps float32's relative accuracy as
``F.cross_entropy`` does. Only (N,) vectors are saved: each max and its sum, not their rounded log-sum-exp (at
temperature 0.01 the lse is ~100 and its float32 rounding would bias every probability by ~1e-5). Backward
recomputes each block and forms the softmax from them (Inf-CL, Cheng et al. 2024,
https://arxiv.org/abs/2410.17243); for upstream gradients g (rows) and h (columns):

    dL/dl_ij = g_i (exp(l_ij - max_i) / sum_i - [j = t_i]) + h_j (exp(l_ij - max^col_j) / sum^col_j - [i = j])

Memory above the inputs and their gradients: two or three (tile_size, column_tile_size) blocks, a few
(tile_size, D) and (column_tile_size, D) ones and O(N + M) statistics. A column block of M or more columns is
the strip scheme (one block per row strip), O(tile_size * M). Each block is (u @ v^T) * s, rounded as the dense
losses round their logits, so in float32 tiled and dense err alike. dL/ds = sum_i u_i . (dL/dl @ V)_i reuses
the row-gradient matmul: O(t D), no (t, c) product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .precision import full_precision
from .unit_blocks import UnitBlocks, distinct_inputs, spans, to_input_gradients

__all__ = ["tiled_logsumexp"]


@dataclass(frozen=True)
class _Plan:
    row_parts: tuple[int, ...]  # indices into the distinct inputs, stacked as the rows
    column_parts: tuple[int, ...]  # the same for the columns
    tile_size: int
    column_tile_size: int
    with_columns: bool
    exclude_diagonal: bool


def _block_logits(row_units: torch.Tensor, column_units: torch.Tensor, scale: torch.Tensor,
                  row_start: int, column_start: int, exclude_diagonal: bool) -> torch.Tensor:
    """(t, c) logits of one block; the self pairs (global row == global column) masked to -inf if asked."""
    logits = (row_units @ column_units.T).mul_(scale)  # (t, c)
    if exclude_diagonal:
        # Entry (a, b) is the pair (row_start + a, column_start + b): a self pair where b - a = row_start - column_start
        logits.diagonal(offset=row_start - column_start).fill_(float("-inf"))
    return logits


def _target_tiles(targets: torch.Tensor, column_tile_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's target as (index of its column tile, column within that tile): (t,), (t, 1)."""
    return torch.div(targets, column_tile_size, rounding_mode="floor"), (targets % column_tile_size)[:, None]


def _within(local: torch.Tensor, width: int, column_tile_size: int) -> torch.Tensor:
    """``local`` clamped into a last, narrower tile (rows whose target lies there are inside it anyway)."""
    return local if width == column_tile_size else local.clamp(max=width - 1)


def _forward(plan: _Plan, rows: UnitBlocks, columns: UnitBlocks, scale: torch.Tensor,
             targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Row and column losses, then each direction's max and sum of exp(l - max); columns empty unless asked."""
    n, m = rows.count, columns.count
    dtype, device = scale.dtype, scale.device
    # The lowest finite value, not -inf, starts each max: a first block whose row is all masked (NT-Xent's self
    # pair alone) then rescales by exp(lowest - lowest) = 1 a sum of 0, never by exp(-inf + inf) = nan.
    lowest = torch.finfo(dtype).min
    row_loss, row_max, row_sum = (torch.empty(n, dtype=dtype, device=device) for _ in range(3))  # (N,)
    n_columns = n if plan.with_columns else 0  # columns j < N have a target row: row j
    column_max = torch.full((n_columns,), lowest, dtype=dtype, device=device)  # (N,)
    column_sum = torch.zeros(n_columns, dtype=dtype, device=device)  # (N,): sum_i exp(l_ij - column_max_j) so far
    column_target = torch.empty(n_columns, dtype=dtype, device=device)  # (N,): l_jj
    for row_start, row_stop in spans(n, plan.tile_size):
        row_units, row_targets = rows.block(row_start, row_stop), targets[row_start:row_stop]  # (t, D), (t,)
        running_max = torch.full((row_stop - row_start,), lowest, dtype=dtype, device=device)  # (t,)
        running_sum = torch.zeros_like(running_max)
        target_logit = torch.zeros_like(running_max)
        target_tile, target_local = _target_tiles(row_targets, plan.column_tile_size)
        for tile, (column_start, column_stop) in enumerate(spans(m, plan.column_tile_size)):
            logits = _block_logits(row_units, columns.block(column_start, column_stop), scale, row_start,
                                   column_start, plan.exclude_diagonal)  # (t, c)
            local = _within(target_local, column_stop - column_start, plan.column_tile_size)
            target_logit = torch.where(target_tile == tile, logits.gather(1, local).squeeze(1), target_logit)
            new_max = torch.maximum(running_max, logits.amax(dim=1))  # (t,)
            running_sum.mul_((running_max - new_max).exp_()).add_((logits - new_max[:, None]).exp_().sum(dim=1))
            running_max = new_max
            if column_start < n_columns:
                end = min(column_stop, n_columns)
                block = logits[:, : end - column_start]  # (t, c'): the columns with a target row
                diagonal = block.diagonal(offset=row_start - column_start)  # pairs (j, j), j from max(starts)
                first = max(row_start, column_start)
                column_target[first:first + diagonal.numel()] = diagonal
                old_max = column_max[column_start:end]
                new_column_max = torch.maximum(old_max, block.amax(dim=0))  # (c',)
                column_sum[column_start:end].mul_((old_max - new_column_max).exp_()).add_(
                    block.sub_(new_column_max[None, :]).exp_().sum(dim=0))
                column_max[column_start:end] = new_column_max
            del logits
        row_max[row_start:row_stop], row_sum[row_start:row_stop] = running_max, running_sum
        row_loss[row_start:row_stop] = (running_max - target_logit) + running_sum.log()
    column_loss = (column_max - column_target) + column_sum.log()
    return row_loss, column_loss, row_max, row_sum, column_max, column_sum


def _backward(ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None) -> tuple:
    scale, targets, row_max, row_sum, column_max, column_sum, *tensors = ctx.saved_tensors
    plan: _Plan = ctx.plan
    need_scale, need_inputs = ctx.needs_input_grad[1], ctx.needs_input_grad[3:]
    rows, columns = UnitBlocks(tensors, plan.row_parts), UnitBlocks(tensors, plan.column_parts)
    n, m, n_columns = rows.count, columns.count, column_max.numel()
    # One dL/du buffer per distinct input, for rows and columns alike; it becomes the input's gradient.
    grads = [torch.zeros_like(t) if need else None for t, need in zip(tensors, need_inputs)]
    need_rows = any(grads[index] is not None for index in plan.row_parts)
    need_columns = any(grads[index] is not None for index in plan.column_parts)
    grad_scale = torch.zeros_like(scale) if need_scale else None
    row_factor = None if grad_row is None else grad_row / row_sum  # (N,)
    column_factor = None if grad_column is None else grad_column / column_sum  # (N,)
    for row_start, row_stop in spans(n, plan.tile_size):
        row_units = rows.block(row_start, row_stop)  # (t, D)
        scaled_row_units = row_units * scale if need_columns else None  # (t, D): d logits / d columns
        row_part = torch.zeros_like(row_units) if (need_rows or need_scale) else None  # (t, D): dL/d(s u)
        if grad_row is not None:
            target_tile, target_local = _target_tiles(targets[row_start:row_stop], plan.column_tile_size)
            minus_grad_row = -grad_row[row_start:row_stop]  # (t,): the one-hot's share of the weights
        for tile, (column_start, column_stop) in enumerate(spans(m, plan.column_tile_size)):
            if grad_row is None:  # only the columns with a target row carry a gradient
                column_stop = min(column_stop, n_columns)
                if column_start >= column_stop:
                    break
            column_units = columns.block(column_start, column_stop)  # (c, D)
            logits = _block_logits(row_units, column_units, scale, row_start, column_start,
                                   plan.exclude_diagonal)  # (t, c)
            # weights = dL/dlogits of this block: softmax minus one-hot, times the upstream gradient.
            weights = None
            if grad_row is not None:
                weights = (logits - row_max[row_start:row_stop, None]).exp_().mul_(
                    row_factor[row_start:row_stop, None])  # (t, c)
                local = _within(target_local, column_stop - column_start, plan.column_tile_size)
                weights.scatter_add_(1, local, (minus_grad_row * (target_tile == tile))[:, None])
            if grad_column is not None and column_start < n_columns:
                end = min(column_stop, n_columns)
                block = logits[:, : end - column_start].sub_(column_max[None, column_start:end]).exp_().mul_(
                    column_factor[None, column_start:end])  # (t, c')
                first = max(row_start, column_start)
                diagonal = block.diagonal(offset=row_start - column_start)
                diagonal.sub_(grad_column[first:first + diagonal.numel()])
                if weights is None:
                    weights = block
                else:
                    weights[:, : end - column_start] += block
            del logits
            if weights is None:
                continue
            if need_columns:
                columns.add_product(grads, column_start, column_stop, weights.T, scaled_row_units)  # (c, D)
            if row_part is not None:
                row_part.addmm_(weights, column_units)
            del weights
        if row_part is None:
            continue
        if grad_scale is not None:
            # dL/ds = sum_ij w_ij u_i . v_j = sum_i u_i . (w @ V)_i: O(t D), no (t, c) product needed.
            grad_scale += (row_units * row_part).sum()
        if need_rows:
            rows.add(grads, row_start, row_stop, row_part.mul_(scale))
    to_input_gradients(tensors, grads, plan.tile_size)
    return (None, grad_scale, None, *grads)


class _TiledLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: _Plan, scale: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        with full_precision(scale.device):
            row_loss, column_loss, *statistics = _forward(
                plan, UnitBlocks(tensors, plan.row_parts), UnitBlocks(tensors, plan.column_parts), scale, targets)
        ctx.save_for_backward(scale, targets, *statistics, *tensors)
        ctx.plan, ctx.device, ctx.input_count = plan, scale.device, 3 + len(tensors)
        return row_loss, column_loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None) -> tuple:
        if not ctx.plan.with_columns:
            grad_column = None
        if grad_row is None and grad_column is None:
            return (None,) * ctx.input_count
        # A backward called inside autocast must not drop the blocks to half precision.
        with full_precision(ctx.device):
            return _backward(ctx, grad_row, grad_column)


def tiled_logsumexp(
    rows: Sequence[torch.Tensor],
    columns: Sequence[torch.Tensor],
    scale: torch.Tensor,
    targets: torch.Tensor,
    tile_size: int,
    column_tile_size: int | None = None,
    *,
    with_columns: bool = False,
    exclude_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy of each row (and column) of ``scale * U @ V.T``, U and V the unit rows, in blocks.

    row_i = log sum_j exp(s u_i.v_j) - s u_i.v_{t_i}; memory O(tile_size * column_tile_size + N + M) above the
    inputs and their gradients, never (N, M).

    Args:
        rows: raw (N_k, D) tensors in the compute dtype, stacked in order as the N rows; normalised inside.
        columns: the same for the M columns; may share tensors with ``rows`` (one gradient buffer each).
        scale: 0-dim tensor s (1 / temperature); gets a gradient if it requires one.
        targets: (N,) long, t_i = the column of row i's positive.
        tile_size: rows per block (>= 1; the losses check it).
        column_tile_size: columns per block; None for ``tile_size``; M or more gives one strip per row block.
        with_columns: also return col_j = log sum_i exp(l_ij) - l_jj for the first N columns, whose positive
            is row j; needs ``targets == arange(N)`` and no ``exclude_diagonal``.
        exclude_diagonal: drop the pair (i, i) from every sum, for losses that score a set against itself.

    Returns:
        ``(row, col)``: (N,) tensors; ``col`` is None unless ``with_columns``.
    """
    n = sum(t.shape[0] for t in rows)
    if with_columns and (exclude_diagonal or not torch.equal(targets, torch.arange(n, device=targets.device))):
        raise ValueError(
            "tiled_logsumexp: with_columns=True needs targets == arange(N) (column j pairs with row j) "
            "and exclude_diagonal=False"
        )
    tensors, (row_parts, column_parts) = distinct_inputs(rows, columns)
    plan = _Plan(row_parts, column_parts, tile_size, column_tile_size or tile_size, with_columns, exclude_diagonal)
    row_loss, column_loss = _TiledLogSumExp.apply(plan, scale, targets, *tensors)
    return row_loss, (column_loss if with_columns else None)
