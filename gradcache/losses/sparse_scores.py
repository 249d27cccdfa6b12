"""Dot products of sparse rows, S = Q D^T, and InfoNCE over them, without making the rows dense: phase (2) of
GradCache's ``sparse_cache`` (SPLADE) pays the non-zeros and one block of rows at a time.

    S_ij = sum_v q_iv d_jv
    dL/dq_iv = sum_j dL/dS_ij d_jv      at the non-zeros of q only
    dL/dd_jv = sum_i dL/dS_ij q_iv      at the non-zeros of d only

The gradient at a zero of a row is not computed: the rows of a sparse cache are 0 where a clamp at zero sent them,
and no gradient passes there (gradcache/sparse_rows.py says where this holds). Forward: D made dense a block of
rows at a time and multiplied by the sparse Q, (N_q, b) per block; backward: Q^T or D^T, sparse, times a block of
dL/dS, (V, b), read at the block's non-zeros. A block holds at most ``BLOCK_ELEMENTS`` values, whatever N.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gradcache.sparse_rows import SparseRows, dense_piece

__all__ = ["BLOCK_ELEMENTS", "plain_dot_infonce", "sparse_infonce", "sparse_scores", "take_rows"]

BLOCK_ELEMENTS = 2**22  # values in one dense block of rows (16 MB of float32)


def sparse_scores(query: SparseRows, documents: SparseRows) -> torch.Tensor:
    """S = Q D^T, (N_q, N_d), differentiable in `query.values` and `documents.values` (module docstring)."""
    if query.size[1] != documents.size[1]:
        raise ValueError(f"query rows have {query.size[1]} columns and document rows {documents.size[1]}; sparse "
                         "scores need rows of one vocabulary")
    return _SparseScores.apply(query.values, documents.values, query.indices, documents.indices, query.size,
                               documents.size)


def sparse_infonce(query: SparseRows, documents: SparseRows, labels: torch.Tensor,
                   temperature: float | torch.Tensor) -> torch.Tensor:
    """-1/N sum_i log softmax_j(<q_i, d_j> / t)[labels_i]: InfoNCE by dot product, every document a candidate of
    every query, from sparse rows (`sparse_scores`)."""
    return F.cross_entropy(sparse_scores(query, documents) / temperature, labels)


def plain_dot_infonce(loss: Any) -> float | torch.Tensor | None:
    """The temperature of `loss` if it is InfoNCE by dot product in its plain form (one direction, query to
    document, in-batch and hard negatives alike, no queue, tiles, hardness or guide), whose value `sparse_infonce`
    computes; else None. Reads this library's `InfoNCE` and sentence-transformers' `MultipleNegativesRankingLoss`
    family (their `scale` = 1 / temperature) by the attributes they share."""
    if getattr(loss, "directions", None) != ("query_to_doc",) or getattr(loss, "hardness_mode", "") is not None:
        return None
    if getattr(loss, "partition_mode", "joint") != "joint":
        return None
    if hasattr(loss, "similarity") and hasattr(loss, "temperature"):  # gradcache.losses.InfoNCE
        plain = (loss.similarity == "dot" and not loss.queue_size and loss.tile_size is None
                 and loss.column_tile_size is None)
        return loss.temperature if plain else None
    similarity = getattr(loss, "similarity_fct", None)
    if hasattr(loss, "scale") and getattr(similarity, "__name__", "") == "dot_score" \
            and not getattr(loss, "gather_across_devices", False):  # sentence-transformers'
        return 1.0 / loss.scale
    return None


def take_rows(rows: SparseRows, index: torch.Tensor) -> SparseRows:
    """Rows `index` (distinct, increasing) of sparse rows, in that order, differentiable in `rows.values`."""
    where = torch.full((rows.size[0],), -1, dtype=torch.long, device=rows.values.device)
    where[index] = torch.arange(index.numel(), device=where.device)
    new_rows = where[rows.indices[0].long()]
    kept = new_rows >= 0
    indices = torch.stack([new_rows[kept], rows.indices[1][kept].long()]).to(rows.indices.dtype)
    return SparseRows(indices, rows.values[kept], torch.Size((index.numel(), rows.size[1])))


def _block_rows(width: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(1, width))


def _coo(indices: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(indices.long(), values, size, check_invariants=False).coalesce()


class _SparseScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_values, d_values, q_indices, d_indices, q_size, d_size):
        query = _coo(q_indices, q_values, q_size)  # (N_q, V)
        documents = SparseRows(d_indices, d_values, d_size)
        scores = q_values.new_empty((q_size[0], d_size[0]))
        block = _block_rows(d_size[1])
        for start in range(0, d_size[0], block):
            stop = min(start + block, d_size[0])
            scores[:, start:stop] = torch.sparse.mm(query, dense_piece(documents, start, stop).T)  # (N_q, b)
        ctx.save_for_backward(q_values, d_values, q_indices, d_indices)
        ctx.sizes = (q_size, d_size)
        return scores

    @staticmethod
    def backward(ctx, grad):  # grad: (N_q, N_d)
        q_values, d_values, q_indices, d_indices = ctx.saved_tensors
        query, documents = SparseRows(q_indices, q_values, ctx.sizes[0]), SparseRows(d_indices, d_values, ctx.sizes[1])
        grad_q = _at_non_zeros(grad, documents, query) if ctx.needs_input_grad[0] else None
        grad_d = _at_non_zeros(grad.T, query, documents) if ctx.needs_input_grad[1] else None
        return grad_q, grad_d, None, None, None, None


def _at_non_zeros(grad: torch.Tensor, other: SparseRows, rows: SparseRows) -> torch.Tensor:
    """(grad @ other)[r, c] at each non-zero (r, c) of `rows`: (nnz,), a block of `rows`' rows at a time as
    other^T (sparse, (V, N_other)) @ grad[block]^T ((N_other, b))."""
    other_t = _coo(other.indices.flip(0), other.values, (other.size[1], other.size[0]))  # (V, N_other)
    row, column = rows.indices[0].long(), rows.indices[1].long()
    block = _block_rows(rows.size[1])
    if block >= rows.size[0]:  # one block: every non-zero, no mask to find them by (a host read)
        return torch.sparse.mm(other_t, grad.T.contiguous())[column, row].to(rows.values.dtype)  # (V, N) at (c, r)
    out = rows.values.new_zeros(rows.values.shape)
    for start in range(0, rows.size[0], block):
        stop = min(start + block, rows.size[0])
        inside = (row >= start) & (row < stop)
        product = torch.sparse.mm(other_t, grad[start:stop].T.contiguous())  # (V, b)
        out[inside] = product[column[inside], row[inside] - start]
    return out
