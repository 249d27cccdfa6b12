"""Row and column log-sum-exp of scaled similarities, computed strip by strip so no N x M matrix ever exists.

    row_lse_i = log sum_j exp(s * r_i . c_j),   col_lse_j = log sum_i exp(s * r_i . c_j)

This is the one piece of every softmax contrastive loss that needs the full similarity matrix: the loss is
``lse - s * (positive pair similarity)``, and the positive term is O(N D) plain autograd. Forward walks over
strips of ``tile_size`` rows against all M columns: each strip's row LSE is exact, and the column LSE is
merged across strips with ``logaddexp``. Only the two LSE vectors are saved. Backward recomputes each strip
and forms the softmax weights from the saved LSEs (Inf-CL, Cheng et al. 2024, https://arxiv.org/abs/2410.17243):

    dL/dlogit_ij = g_i exp(logit_ij - row_lse_i) + h_j exp(logit_ij - col_lse_j)

for upstream gradients g (rows) and h (columns). Peak memory is a few (tile_size, M) strips plus the inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = ["tiled_logsumexp"]


def _strip_logits(
    rows: torch.Tensor, columns: torch.Tensor, scale: torch.Tensor, start: int, stop: int, exclude_diagonal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and logits of rows[start:stop] against every column; the self pair masked to -inf if asked."""
    cosine = rows[start:stop] @ columns.T  # (t, M)
    logits = cosine * scale  # (t, M)
    if exclude_diagonal:
        # Row start + r meets itself in column start + r: the strip's diagonal at offset ``start``.
        logits.diagonal(offset=start).fill_(float("-inf"))
    return cosine, logits


class _TiledLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        columns: torch.Tensor,
        scale: torch.Tensor,
        tile_size: int,
        with_columns: bool,
        exclude_diagonal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        row_lse = rows.new_empty(rows.shape[0])  # (N,)
        # -inf is the identity of logaddexp, so strips merge into it one by one.
        col_lse = rows.new_full((columns.shape[0] if with_columns else 0,), float("-inf"))  # (M,) or (0,)
        for start in range(0, rows.shape[0], tile_size):
            stop = min(start + tile_size, rows.shape[0])
            _, logits = _strip_logits(rows, columns, scale, start, stop, exclude_diagonal)
            row_lse[start:stop] = torch.logsumexp(logits, dim=1)
            if with_columns:
                col_lse = torch.logaddexp(col_lse, torch.logsumexp(logits, dim=0))
            del logits
        ctx.save_for_backward(rows, columns, scale, row_lse, col_lse)
        ctx.tile_size, ctx.with_columns, ctx.exclude_diagonal = tile_size, with_columns, exclude_diagonal
        return row_lse, col_lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_row: torch.Tensor | None, grad_col: torch.Tensor | None) -> tuple:
        rows, columns, scale, row_lse, col_lse = ctx.saved_tensors
        need_rows, need_columns, need_scale = ctx.needs_input_grad[:3]
        if not ctx.with_columns:
            grad_col = None
        if grad_row is None and grad_col is None:
            return None, None, None, None, None, None
        grad_rows = torch.zeros_like(rows) if need_rows else None
        grad_columns = torch.zeros_like(columns) if need_columns else None
        grad_scale = torch.zeros((), dtype=rows.dtype, device=rows.device) if need_scale else None
        for start in range(0, rows.shape[0], ctx.tile_size):
            stop = min(start + ctx.tile_size, rows.shape[0])
            cosine, logits = _strip_logits(rows, columns, scale, start, stop, ctx.exclude_diagonal)
            # weights = dL/dlogits for this strip, built in place to keep at most three (t, M) buffers alive.
            if grad_row is not None:
                weights = (logits - row_lse[start:stop, None]).exp_().mul_(grad_row[start:stop, None])  # (t, M)
                if grad_col is not None:
                    weights.add_(logits.sub_(col_lse[None, :]).exp_().mul_(grad_col[None, :]))
            else:
                weights = logits.sub_(col_lse[None, :]).exp_().mul_(grad_col[None, :])  # (t, M)
            del logits
            if grad_rows is not None:
                grad_rows[start:stop] = weights @ columns  # (t, D)
            if grad_columns is not None:
                grad_columns.addmm_(weights.T, rows[start:stop])  # (M, D)
            if grad_scale is not None:
                # dlogit/dscale = cosine; masked self pairs carry weight 0, so they add nothing.
                grad_scale += torch.dot(weights.flatten(), cosine.flatten())
            del cosine, weights
        # Every logit is scale * cosine, so the embedding gradients share one factor of scale.
        if grad_rows is not None:
            grad_rows.mul_(scale)
        if grad_columns is not None:
            grad_columns.mul_(scale)
        return grad_rows, grad_columns, grad_scale, None, None, None


def tiled_logsumexp(
    rows: torch.Tensor,
    columns: torch.Tensor,
    scale: torch.Tensor,
    tile_size: int,
    *,
    with_columns: bool = False,
    exclude_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Row (and optionally column) log-sum-exp of ``scale * rows @ columns.T``, in strips of ``tile_size`` rows.

    lse_i = log sum_j exp(s r_i . c_j); memory O(tile_size * M + (N + M) * D), never (N, M).

    Args:
        rows: (N, D) tensor, already normalised and in the compute dtype.
        columns: (M, D) tensor, same dtype and device as ``rows``; may be ``rows`` itself.
        scale: 0-dim tensor s (1 / temperature); gets a gradient if it requires one.
        tile_size: rows per strip (>= 1; the losses check it).
        with_columns: also return the column LSE (M,), for symmetric losses.
        exclude_diagonal: drop the pair (i, i) from both sums, for losses that score a set against itself.

    Returns:
        ``(row_lse, col_lse)``: (N,) and (M,) tensors; ``col_lse`` is None unless ``with_columns``.
    """
    row_lse, col_lse = _TiledLogSumExp.apply(rows, columns, scale, tile_size, with_columns, exclude_diagonal)
    return row_lse, (col_lse if with_columns else None)
