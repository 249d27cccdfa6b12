"""Per-query cross-entropy of MaxSim scores, in blocks of queries x documents: no N x M x Lq x Ld tensor ever exists.

    s_ab = sum_i w_ai max_{j: m_bj} <q_ai, d_bj>,   l_ab = s_ab / t,   row_a = log sum_b exp(l_ab) - l_aa

with w_ai the weight of query token i (its mask, divided by the query's token count for the mean) and m_bj the
document mask; document a is query a's positive. Forward walks blocks of ``tile_size`` queries x
``column_tile_size`` documents: each block forms its (t, c, Lq, Ld) token similarities, reduces them to (t, c)
scores, and folds those into a running max and a running sum of exp(l - max) per query, as flash attention keeps
its softmax statistics (``tiled_logsumexp.py`` does the same for vectors). Only (N,) statistics are saved beside
the inputs. Backward recomputes each block's similarities and takes the winning document token j* of every
(query token, document) pair: an index of the block, never kept across blocks. It writes dL/ds_ab w_ai at j*
into the similarities' own buffer (a (t, c, Lq, Ld) one-hot weight P), and two matmuls give the block's share of
both gradients:

    dL/dl_ab = g_a (exp(l_ab - max_a) / sum_a - [b = a]),   dL/dq_ai = sum_b dL/ds_ab w_ai d_{b j*},
    dL/dd_bj = sum_{a, i: j* = j} dL/ds_ab w_ai q_ai

Memory above the inputs and their gradients: one (t, c, Lq, Ld) block, a few (t, c, Lq) ones and O(N) statistics,
flat in N for fixed tiles. Documents come in parts (positives, hard negatives) of their own lengths; a block that
straddles two is the only place their rows are copied together, padded to the longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .precision import full_precision
from .unit_blocks import spans

__all__ = ["tiled_maxsim"]


@dataclass(frozen=True)
class _Plan:
    tile_size: int
    column_tile_size: int
    scale: float  # 1 / t
    part_count: int  # document parts


class _Documents:
    """Document parts (values (M_k, L_k, D), mask (M_k, L_k)) read as one stack of M rows, a block at a time."""

    def __init__(self, values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> None:
        self.values, self.masks = list(values), list(masks)
        self.offsets = [0]
        for part in self.values:
            self.offsets.append(self.offsets[-1] + part.shape[0])
        self.count = self.offsets[-1]

    def _pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(part, first row, end row) of each part that rows start..stop of the stack touch."""
        pieces = []
        for part in range(len(self.values)):
            low, high = max(start, self.offsets[part]), min(stop, self.offsets[part + 1])
            if low < high:
                pieces.append((part, low - self.offsets[part], high - self.offsets[part]))
        return pieces

    def block(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows start..stop: values (c, L, D) and mask (c, L), parts padded to the longest they hold."""
        pieces = self._pieces(start, stop)
        if len(pieces) == 1:
            part, low, high = pieces[0]
            return self.values[part][low:high], self.masks[part][low:high]
        length = max(self.values[part].shape[1] for part, _, _ in pieces)
        values = [F.pad(self.values[p][low:high], (0, 0, 0, length - self.values[p].shape[1]))
                  for p, low, high in pieces]
        masks = [F.pad(self.masks[p][low:high], (0, length - self.masks[p].shape[1])) for p, low, high in pieces]
        return torch.cat(values), torch.cat(masks)

    def add(self, grads: list[torch.Tensor | None], start: int, stop: int, block_grad: torch.Tensor) -> None:
        """Add a block's (c, L, D) gradient into each part's buffer, cut back to the part's own length."""
        for part, low, high in self._pieces(start, stop):
            if grads[part] is not None:
                first = self.offsets[part] + low - start
                grads[part][low:high] += block_grad[first:first + high - low, : self.values[part].shape[1]]


def _similarities(query: torch.Tensor, document: torch.Tensor,
                  document_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """<q_ai, d_bj> of one block, masked documents' tokens at -inf: the buffer (t Lq, c Ld) and its view
    (t, c, Lq, Ld)."""
    t, lq, dim = query.shape
    c, ld = document_mask.shape
    flat = query.reshape(t * lq, dim) @ document.reshape(c * ld, dim).T  # (t Lq, c Ld)
    similarities = flat.view(t, lq, c, ld).transpose(1, 2)  # (t, c, Lq, Ld)
    similarities.masked_fill_(~document_mask[None, :, None, :], float("-inf"))
    return flat, similarities


def _forward(plan: _Plan, query: torch.Tensor, weights: torch.Tensor,
             documents: _Documents) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each query's loss, and its max and sum of exp(l - max): (N,) each."""
    n, dtype, device = query.shape[0], query.dtype, query.device
    lowest = torch.finfo(dtype).min  # not -inf: a first rescale exp(lowest - lowest) = 1, never nan
    row_loss, row_max, row_sum = (torch.empty(n, dtype=dtype, device=device) for _ in range(3))  # (N,)
    for row_start, row_stop in spans(n, plan.tile_size):
        block_query, block_weights = query[row_start:row_stop], weights[row_start:row_stop]  # (t, Lq, D), (t, Lq)
        running_max = torch.full((row_stop - row_start,), lowest, dtype=dtype, device=device)  # (t,)
        running_sum = torch.zeros_like(running_max)
        target_logit = torch.zeros_like(running_max)
        for column_start, column_stop in spans(documents.count, plan.column_tile_size):
            _, similarities = _similarities(block_query, *documents.block(column_start, column_stop))
            best = similarities.amax(dim=3)  # (t, c, Lq)
            del similarities
            logits = (best * block_weights[:, None, :]).sum(dim=2).mul_(plan.scale)  # (t, c)
            # Entry (x, y) is the pair (row_start + x, column_start + y): the target where they are equal.
            diagonal = logits.diagonal(offset=row_start - column_start)
            first = max(row_start, column_start) - row_start
            target_logit[first:first + diagonal.numel()] = diagonal
            new_max = torch.maximum(running_max, logits.amax(dim=1))  # (t,)
            running_sum.mul_((running_max - new_max).exp_()).add_((logits - new_max[:, None]).exp_().sum(dim=1))
            running_max = new_max
        row_max[row_start:row_stop], row_sum[row_start:row_stop] = running_max, running_sum
        row_loss[row_start:row_stop] = (running_max - target_logit) + running_sum.log()
    return row_loss, row_max, row_sum


def _backward(ctx: Any, grad_row: torch.Tensor) -> tuple:
    plan: _Plan = ctx.plan
    row_max, row_sum, query, weights, *parts = ctx.saved_tensors
    document_values, document_masks = parts[: plan.part_count], parts[plan.part_count:]
    documents = _Documents(document_values, document_masks)
    need_query, need_documents = ctx.needs_input_grad[1], ctx.needs_input_grad[3:3 + plan.part_count]
    grad_query = _zeros(query) if need_query else None  # contiguous, whatever the input's strides
    grad_documents = [_zeros(v) if need else None for v, need in zip(document_values, need_documents)]
    row_factor = grad_row / row_sum  # (N,)
    n, dim = query.shape[0], query.shape[2]
    for row_start, row_stop in spans(n, plan.tile_size):
        block_query, block_weights = query[row_start:row_stop], weights[row_start:row_stop]  # (t, Lq, D), (t, Lq)
        t, lq = block_weights.shape
        block_grad = grad_query[row_start:row_stop].view(t * lq, dim) if need_query else None  # (t Lq, D)
        for column_start, column_stop in spans(documents.count, plan.column_tile_size):
            document, document_mask = documents.block(column_start, column_stop)  # (c, Ld, D), (c, Ld)
            flat, similarities = _similarities(block_query, document, document_mask)
            best, winner = similarities.max(dim=3)  # (t, c, Lq): each (query token, document)'s winning token
            logits = (best * block_weights[:, None, :]).sum(dim=2).mul_(plan.scale)  # (t, c)
            # dL/dl: softmax times the upstream gradient, minus it at the target; dL/ds = dL/dl / t
            grad_scores = (logits - row_max[row_start:row_stop, None]).exp_().mul_(row_factor[row_start:row_stop, None])
            diagonal = grad_scores.diagonal(offset=row_start - column_start)
            first = max(row_start, column_start)
            diagonal.sub_(grad_row[first:first + diagonal.numel()])
            grad_scores.mul_(plan.scale)
            # P: dL/ds_ab w_ai at each winning token, in the similarities' buffer
            shares = grad_scores[:, :, None] * block_weights[:, None, :]  # (t, c, Lq): dL/ds_ab w_ai
            similarities.zero_().scatter_(3, winner.unsqueeze(3), shares.unsqueeze(3))
            del best, winner, logits, grad_scores, shares
            c, ld = document_mask.shape
            if block_grad is not None:
                block_grad.addmm_(flat, document.reshape(c * ld, dim))  # (t Lq, D)
            if any(g is not None for g in grad_documents):
                documents.add(grad_documents, column_start, column_stop,
                              (flat.T @ block_query.reshape(t * lq, dim)).view(c, ld, dim))  # (c, Ld, D)
    return (None, grad_query, None, *grad_documents, *(None,) * plan.part_count)


def _zeros(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(like.shape, dtype=like.dtype, device=like.device)


class _TiledMaxSim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: _Plan, query: torch.Tensor, weights: torch.Tensor,  # type: ignore[override]
                *parts: torch.Tensor) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        documents = _Documents(parts[: plan.part_count], parts[plan.part_count:])
        with full_precision(query.device):
            row_loss, row_max, row_sum = _forward(plan, query, weights, documents)
        ctx.save_for_backward(row_max, row_sum, query, weights, *parts)
        ctx.plan, ctx.device = plan, query.device
        return row_loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_row: torch.Tensor | None) -> tuple:
        if grad_row is None:
            return (None,) * (3 + 2 * ctx.plan.part_count)
        with full_precision(ctx.device):  # a backward called inside autocast keeps the blocks in full precision
            return _backward(ctx, grad_row)


def tiled_maxsim(
    query: torch.Tensor,
    weights: torch.Tensor,
    documents: Sequence[tuple[torch.Tensor, torch.Tensor]],
    scale: float,
    tile_size: int,
    column_tile_size: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of each query over the MaxSim logits s_ab / t of every document, its target document a.

    row_a = log sum_b exp(s_ab / t) - s_aa / t; memory O(tile_size * column_tile_size * Lq * Ld + N) above the
    inputs and their gradients, never (N, M, Lq, Ld).

    Args:
        query: (N, Lq, D) token vectors in the compute dtype.
        weights: (N, Lq) constant weight of each query token (0 where masked).
        documents: (values (M_k, L_k, D), mask (M_k, L_k) bool) parts, stacked in order as the M >= N documents;
            document a < N is query a's positive. Every document has a True in its mask.
        scale: 1 / t.
        tile_size: queries per block (>= 1; the loss checks it).
        column_tile_size: documents per block; None for ``tile_size``.

    Returns:
        (N,) per-query losses.
    """
    plan = _Plan(tile_size, column_tile_size or tile_size, float(scale), len(documents))
    values = [v for v, _ in documents]
    masks = [m for _, m in documents]
    return _TiledMaxSim.apply(plan, query, weights, *values, *masks)
