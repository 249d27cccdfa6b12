"""Per-row (and per-column) cross-entropy of scaled similarities, computed in strips: no N x M matrix ever exists.

    row_i = log sum_j exp(l_ij - p_i),   col_j = log sum_i exp(l_ij - p_j),   l_ij = s r_i . c_j

where p_i = l_{i, t_i} is the positive logit of row i, so row_i is exactly the cross-entropy of row i with
target t_i, i.e. its log-sum-exp minus its positive logit. Subtracting p_i inside the sum, with the target
term pinned to exp(0) = 1, keeps float32 as accurate as ``F.cross_entropy``: a small loss stays small
instead of being the difference of two large, rounded numbers (lse_i ~ s and p_i ~ s at low temperature).

Forward walks over strips of ``tile_size`` rows against all M columns: each strip's row values are exact, and
the column values merge across strips with ``logaddexp``. Only the (N,) outputs are saved. Backward recomputes
each strip and forms the softmax weights from the saved outputs (Inf-CL, Cheng et al. 2024,
https://arxiv.org/abs/2410.17243); for upstream gradients g (rows) and h (columns), off-target entries get

    dL/dl_ij = g_i exp(l_ij - p_i - row_i) + h_j exp(l_ij - p_j - col_j),   dL/dp_i = -g_i (1 - e^-row_i) - ...

and target entries get nothing from the strip: their gradient reaches the embeddings through p, which the
caller computes with ordinary autograd. Peak memory is a few (tile_size, M) strips plus the inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .precision import full_precision

__all__ = ["tiled_logsumexp"]


def _strip(
    rows: torch.Tensor, columns: torch.Tensor, scale: torch.Tensor, start: int, stop: int, exclude_diagonal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and logits of rows[start:stop] against every column; the self pair masked to -inf if asked."""
    cosine = rows[start:stop] @ columns.T  # (t, M)
    logits = cosine * scale  # (t, M)
    if exclude_diagonal:
        # Row start + r meets itself in column start + r: the strip's diagonal at offset ``start``.
        logits.diagonal(offset=start).fill_(float("-inf"))
    return cosine, logits


def _row_shifted(logits: torch.Tensor, positive: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """l_ij - p_i with each row's target entry set to exactly 0: (t, M)."""
    shifted = logits - positive[:, None]  # (t, M)
    shifted[torch.arange(shifted.shape[0], device=shifted.device), targets] = 0.0
    return shifted


def _column_shifted(logits: torch.Tensor, positive: torch.Tensor, start: int) -> torch.Tensor:
    """l_ij - p_j over the first N columns, with target entries (start + r, start + r) set to 0: (t, N)."""
    shifted = logits[:, : positive.shape[0]] - positive[None, :]  # (t, N)
    shifted.diagonal(offset=start).zero_()
    return shifted


class _TiledLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        columns: torch.Tensor,
        scale: torch.Tensor,
        positive: torch.Tensor,
        targets: torch.Tensor,
        tile_size: int,
        with_columns: bool,
        exclude_diagonal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        with full_precision(rows.device):
            row_out, column_out = _TiledLogSumExp._forward(
                rows, columns, scale, positive, targets, tile_size, with_columns, exclude_diagonal
            )
        ctx.save_for_backward(rows, columns, scale, positive, targets, row_out, column_out)
        ctx.tile_size, ctx.with_columns, ctx.exclude_diagonal = tile_size, with_columns, exclude_diagonal
        ctx.device = rows.device
        return row_out, column_out

    @staticmethod
    def _forward(
        rows: torch.Tensor,
        columns: torch.Tensor,
        scale: torch.Tensor,
        positive: torch.Tensor,
        targets: torch.Tensor,
        tile_size: int,
        with_columns: bool,
        exclude_diagonal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows.shape[0]
        row_out = rows.new_empty(n)  # (N,)
        # -inf is the identity of logaddexp, so strips merge into it one by one.
        column_out = rows.new_full((n if with_columns else 0,), float("-inf"))  # (N,) or (0,)
        for start in range(0, n, tile_size):
            stop = min(start + tile_size, n)
            _, logits = _strip(rows, columns, scale, start, stop, exclude_diagonal)
            row_out[start:stop] = torch.logsumexp(_row_shifted(logits, positive[start:stop], targets[start:stop]), 1)
            if with_columns:
                strip_columns = torch.logsumexp(_column_shifted(logits, positive, start), dim=0)  # (N,)
                column_out = torch.logaddexp(column_out, strip_columns)
            del logits
        return row_out, column_out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None) -> tuple:
        # A backward called inside autocast must not drop the strips to half precision.
        with full_precision(ctx.device):
            return _TiledLogSumExp._backward(ctx, grad_row, grad_column)

    @staticmethod
    def _backward(ctx: Any, grad_row: torch.Tensor | None, grad_column: torch.Tensor | None) -> tuple:
        rows, columns, scale, positive, targets, row_out, column_out = ctx.saved_tensors
        need_rows, need_columns, need_scale, need_positive = ctx.needs_input_grad[:4]
        if not ctx.with_columns:
            grad_column = None
        if grad_row is None and grad_column is None:
            return (None,) * 8
        n = rows.shape[0]
        grad_rows = torch.zeros_like(rows) if need_rows else None
        grad_columns = torch.zeros_like(columns) if need_columns else None
        grad_scale = torch.zeros_like(scale) if need_scale else None
        for start in range(0, n, ctx.tile_size):
            stop = min(start + ctx.tile_size, n)
            cosine, logits = _strip(rows, columns, scale, start, stop, ctx.exclude_diagonal)
            # weights = dL/dlogits of this strip: softmax probabilities scaled by the upstream gradient.
            weights = torch.zeros_like(logits)  # (t, M)
            if grad_row is not None:
                shifted = _row_shifted(logits, positive[start:stop], targets[start:stop])
                probabilities = shifted.sub_(row_out[start:stop, None]).exp_()
                # The target's own term is handled through p; zero it after the exp pinned it.
                probabilities[torch.arange(stop - start, device=rows.device), targets[start:stop]] = 0.0
                weights += probabilities.mul_(grad_row[start:stop, None])
                del shifted, probabilities
            if grad_column is not None:
                probabilities = _column_shifted(logits, positive, start).sub_(column_out[None, :]).exp_()
                probabilities.diagonal(offset=start).zero_()
                weights[:, :n] += probabilities.mul_(grad_column[None, :])
                del probabilities
            del logits
            if grad_rows is not None:
                grad_rows[start:stop] = weights @ columns  # (t, D)
            if grad_columns is not None:
                grad_columns.addmm_(weights.T, rows[start:stop])  # (M, D)
            if grad_scale is not None:
                # dl/ds = cosine; target and masked entries carry weight 0, so they add nothing.
                grad_scale += torch.dot(weights.flatten(), cosine.flatten())
            del cosine, weights
        # Every logit is s * cosine, so the embedding gradients share one factor of s.
        if grad_rows is not None:
            grad_rows.mul_(scale)
        if grad_columns is not None:
            grad_columns.mul_(scale)
        grad_positive = None
        if need_positive:
            # d row_i / d p_i = -(sum of off-target probabilities) = -(1 - exp(-row_i)) = expm1(-row_i).
            grad_positive = torch.zeros_like(positive)
            if grad_row is not None:
                grad_positive += grad_row * torch.expm1(-row_out)
            if grad_column is not None:
                grad_positive += grad_column * torch.expm1(-column_out)
        return grad_rows, grad_columns, grad_scale, grad_positive, None, None, None, None


def tiled_logsumexp(
    rows: torch.Tensor,
    columns: torch.Tensor,
    scale: torch.Tensor,
    positive_logits: torch.Tensor,
    targets: torch.Tensor,
    tile_size: int,
    *,
    with_columns: bool = False,
    exclude_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy of each row (and column) of ``scale * rows @ columns.T``, in strips of ``tile_size`` rows.

    row_i = log sum_j exp(s r_i.c_j - p_i) = lse_i - p_i; memory O(tile_size * M + (N + M) * D), never (N, M).

    Args:
        rows: (N, D) tensor, already normalised and in the compute dtype.
        columns: (M, D) tensor, same dtype and device; may be ``rows`` itself.
        scale: 0-dim tensor s (1 / temperature); gets a gradient if it requires one.
        positive_logits: (N,) p_i = s r_i . c_{t_i}, computed by the caller with autograd (gradient flows).
        targets: (N,) long, t_i = the column of row i's positive.
        tile_size: rows per strip (>= 1; the losses check it).
        with_columns: also return col_j = log sum_i exp(l_ij - p_j) for the first N columns, whose positive is
            row j; this needs ``targets == arange(N)``.
        exclude_diagonal: drop the pair (i, i) from every sum, for losses that score a set against itself.

    Returns:
        ``(row, col)``: (N,) tensors; ``col`` is None unless ``with_columns``.
    """
    if with_columns and not torch.equal(targets, torch.arange(rows.shape[0], device=targets.device)):
        raise ValueError("tiled_logsumexp: with_columns=True needs targets == arange(N) (column j pairs with row j)")
    row_out, column_out = _TiledLogSumExp.apply(
        rows, columns, scale, positive_logits, targets, tile_size, with_columns, exclude_diagonal
    )
    return row_out, (column_out if with_columns else None)
