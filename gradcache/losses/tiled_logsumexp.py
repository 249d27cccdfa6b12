"""Per-row (and per-column) cross-entropy of scaled similarities, computed in strips: no N x M matrix ever exists.

    row_i = log sum_j exp(l_ij) - l_{i,t_i},   col_j = log sum_i exp(l_ij) - l_jj,   l_ij = s r_i . c_j

i.e. the log-sum-exp of each row (column) minus its target logit: that row's cross-entropy. Forward walks over
strips of ``tile_size`` rows against all M columns. Each row keeps its log-sum-exp as ``max + log(sum of
exp(l - max))``; columns keep a running max and a running sum rescaled as the max grows (online softmax). The
target logit is subtracted from the max, not from the rounded log-sum-exp, so a small loss keeps float32's
relative accuracy exactly as ``F.cross_entropy`` does. Only (N,) vectors are saved: each max and its sum,
not their rounded log-sum-exp (at temperature 0.01 the lse is ~100 and its float32 rounding would bias every
probability by ~1e-5). Backward recomputes each strip and forms the softmax from them (Inf-CL, Cheng et al.
2024, https://arxiv.org/abs/2410.17243); for upstream gradients g (rows) and h (columns):

    dL/dl_ij = g_i (exp(l_ij - max_i) / sum_i - [j = t_i]) + h_j (exp(l_ij - max^col_j) / sum^col_j - [i = j])

Peak memory: two or three (tile_size, M) strips plus the inputs. Each strip is (r @ C^T) * s, rounded exactly
as the dense losses round their logits, so in float32 tiled and dense err alike (scaling the rows first instead
would save one pass but round every logit differently, and at s = 100 that rounding is the whole error budget).
dL/ds = sum_i r_i . (dL/dl @ C)_i reuses the row-gradient matmul: O(t D), no (t, M) product.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .precision import full_precision

__all__ = ["tiled_logsumexp"]


def _strip_logits(
    rows: torch.Tensor, columns: torch.Tensor, scale: torch.Tensor, start: int, stop: int, exclude_diagonal: bool
) -> torch.Tensor:
    """Logits of rows[start:stop] against every column; the self pair masked to -inf if asked."""
    logits = (rows[start:stop] @ columns.T).mul_(scale)  # (t, M)
    if exclude_diagonal:
        # Row start + r meets itself in column start + r: the strip's diagonal at offset ``start``.
        logits.diagonal(offset=start).fill_(float("-inf"))
    return logits


def _forward(
    rows: torch.Tensor,
    columns: torch.Tensor,
    scale: torch.Tensor,
    targets: torch.Tensor,
    tile_size: int,
    with_columns: bool,
    exclude_diagonal: bool,
) -> tuple[torch.Tensor, ...]:
    """Row and column losses, then each direction's max and sum of exp(l - max); columns empty unless asked."""
    n = rows.shape[0]
    row_loss, row_max, row_sum = rows.new_empty(n), rows.new_empty(n), rows.new_empty(n)  # (N,)
    n_columns = n if with_columns else 0
    column_max = rows.new_full((n_columns,), float("-inf"))  # (N,): -inf rescales the empty sum to 0
    column_sum = rows.new_zeros(n_columns)  # (N,): sum_i exp(l_ij - column_max_j) over strips so far
    column_target = rows.new_empty(n_columns)  # (N,): l_jj
    for start in range(0, n, tile_size):
        stop = min(start + tile_size, n)
        logits = _strip_logits(rows, columns, scale, start, stop, exclude_diagonal)  # (t, M)
        strip_rows = torch.arange(stop - start, device=rows.device)
        strip_max = logits.amax(dim=1)  # (t,)
        row_max[start:stop] = strip_max
        row_sum[start:stop] = (logits - strip_max[:, None]).exp_().sum(dim=1)
        row_loss[start:stop] = (strip_max - logits[strip_rows, targets[start:stop]]) + row_sum[start:stop].log()
        if with_columns:
            block = logits[:, :n]  # (t, N): every column with a target row
            column_target[start:stop] = block.diagonal(offset=start)
            new_max = torch.maximum(column_max, block.amax(dim=0))  # (N,)
            column_sum.mul_((column_max - new_max).exp_()).add_(block.sub_(new_max[None, :]).exp_().sum(dim=0))
            column_max = new_max
        del logits
    column_loss = (column_max - column_target) + column_sum.log()
    return row_loss, column_loss, row_max, row_sum, column_max, column_sum


def _backward(
    ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    rows, columns, scale, targets, row_max, row_sum, column_max, column_sum = ctx.saved_tensors
    need_rows, need_columns, need_scale = ctx.needs_input_grad[:3]
    n = rows.shape[0]
    scaled_rows = rows * scale  # (N, D): d logits / d columns, one row per strip row
    grad_rows = torch.zeros_like(rows) if need_rows else None
    grad_columns = torch.zeros_like(columns) if need_columns else None
    grad_scale = torch.zeros_like(scale) if need_scale else None
    for start in range(0, n, ctx.tile_size):
        stop = min(start + ctx.tile_size, n)
        logits = _strip_logits(rows, columns, scale, start, stop, ctx.exclude_diagonal)  # (t, M)
        # weights = dL/dlogits of this strip: softmax minus one-hot, times the upstream gradient.
        if grad_row is not None:
            row_factor = grad_row[start:stop] / row_sum[start:stop]  # (t,)
            weights = (logits - row_max[start:stop, None]).exp_().mul_(row_factor[:, None])  # (t, M)
            strip_rows = torch.arange(stop - start, device=rows.device)
            weights[strip_rows, targets[start:stop]] -= grad_row[start:stop]
        else:
            weights = torch.zeros_like(logits)
        if grad_column is not None:
            column_factor = grad_column / column_sum  # (N,)
            block = logits[:, :n].sub_(column_max[None, :]).exp_().mul_(column_factor[None, :])  # (t, N)
            block.diagonal(offset=start).sub_(grad_column[start:stop])
            weights[:, :n] += block
        del logits
        if grad_columns is not None:
            grad_columns.addmm_(weights.T, scaled_rows[start:stop])  # (M, D)
        if grad_rows is not None or grad_scale is not None:
            row_part = weights @ columns  # (t, D): dL/d(scaled row)
            if grad_rows is not None:
                grad_rows[start:stop] = row_part * scale
            if grad_scale is not None:
                # dL/ds = sum_ij w_ij r_i . c_j = sum_i r_i . (w @ C)_i: O(t D), no (t, M) product needed.
                grad_scale += (rows[start:stop] * row_part).sum()
        del weights
    return grad_rows, grad_columns, grad_scale, None, None, None, None


class _TiledLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        columns: torch.Tensor,
        scale: torch.Tensor,
        targets: torch.Tensor,
        tile_size: int,
        with_columns: bool,
        exclude_diagonal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        with full_precision(rows.device):
            row_loss, column_loss, *statistics = _forward(
                rows, columns, scale, targets, tile_size, with_columns, exclude_diagonal
            )
        ctx.save_for_backward(rows, columns, scale, targets, *statistics)
        ctx.tile_size, ctx.exclude_diagonal, ctx.device = tile_size, exclude_diagonal, rows.device
        return row_loss, column_loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None) -> tuple:
        if grad_row is None and grad_column is None:
            return (None,) * 7
        if ctx.saved_tensors[-1].numel() == 0:
            grad_column = None
        # A backward called inside autocast must not drop the strips to half precision.
        with full_precision(ctx.device):
            return _backward(ctx, grad_row, grad_column)


def tiled_logsumexp(
    rows: torch.Tensor,
    columns: torch.Tensor,
    scale: torch.Tensor,
    targets: torch.Tensor,
    tile_size: int,
    *,
    with_columns: bool = False,
    exclude_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy of each row (and column) of ``scale * rows @ columns.T``, in strips of ``tile_size`` rows.

    row_i = log sum_j exp(s r_i.c_j) - s r_i.c_{t_i}; memory O(tile_size * M + (N + M) * D), never (N, M).

    Args:
        rows: (N, D) tensor, already normalised and in the compute dtype.
        columns: (M, D) tensor, same dtype and device; may be ``rows`` itself.
        scale: 0-dim tensor s (1 / temperature); gets a gradient if it requires one.
        targets: (N,) long, t_i = the column of row i's positive.
        tile_size: rows per strip (>= 1; the losses check it).
        with_columns: also return col_j = log sum_i exp(l_ij) - l_jj for the first N columns, whose positive
            is row j; needs ``targets == arange(N)`` and no ``exclude_diagonal``.
        exclude_diagonal: drop the pair (i, i) from every sum, for losses that score a set against itself.

    Returns:
        ``(row, col)``: (N,) tensors; ``col`` is None unless ``with_columns``.
    """
    if with_columns and (
        exclude_diagonal or not torch.equal(targets, torch.arange(rows.shape[0], device=targets.device))
    ):
        raise ValueError(
            "tiled_logsumexp: with_columns=True needs targets == arange(N) (column j pairs with row j) "
            "and exclude_diagonal=False"
        )
    row_loss, column_loss = _TiledLogSumExp.apply(
        rows, columns, scale, targets, tile_size, with_columns, exclude_diagonal
    )
    return row_loss, (column_loss if with_columns else None)
