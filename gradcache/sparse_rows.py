"""Sparse rows: phase (1)'s cache of nonnegative (B, V) embeddings (SPLADE's vocabulary-sized rows) kept as their
non-zeros, and phase (2)'s gradient kept only there (the option ``sparse_cache=True``).

    cache:    indices (2, nnz) int32 (row, column), values (nnz,)       instead of (B, V)
    gradient: d loss / d values (nnz,)                                  instead of (B, V)

Exact where the encoder's zeros cannot move: a row w = max_t log(1 + relu(x_t)) (SPLADE), relu(x), or any output
that is 0 only where a clamp at zero (relu, its max-pool, its log1p) sends it, since the derivative of relu is 0
there (PyTorch's relu passes no gradient at 0 either): the gradient reaching the parameters through a zero entry
is 0 whatever the loss's gradient at that entry, so dropping the loss's gradient at the zeros leaves every
parameter's gradient unchanged. Not exact for an output that is 0 with a nonzero derivative (an identity or a
tanh output that happens to hit 0): the library cannot see the derivative, so it refuses what it can see, any
negative value (not the output of a clamp at zero): ValueError, before any `.grad` is written.

A chunk's rows cost the host one read, the count of its non-zeros (a buffer's size follows from it); the negative
values are counted on the device and read once, when the chunks are joined (`check_nonnegative`), and a joined
cache records where each chunk's non-zeros start (`SparseRows.pieces`), so cutting it back into its chunks
(`dense_piece`) reads nothing.

The loss receives dense (N, V) rows, built from the cached non-zeros for phase (2) and freed by its backward,
unless it says it takes the non-zeros as they are (an attribute ``takes_sparse_rows = True``, as
``gradcache.losses.SpladeLoss`` has; `takes_sparse_rows`): then phase (2) too is paid by the non-zeros
(gradcache/losses/sparse_scores.py). Under several processes gathering the batch, the rows are made dense.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["SparseRows", "compress", "check_nonnegative", "densify", "join_sparse", "dense_piece",
           "takes_sparse_rows"]


class SparseRows(NamedTuple):
    """(B, V) nonnegative rows by their non-zeros: indices (2, nnz) int32 (row, column), values (nnz,), size (B, V);
    pieces: (first row, first non-zero) of each piece `join_sparse` joined, then (B, nnz), or () when unknown."""

    indices: torch.Tensor
    values: torch.Tensor
    size: torch.Size
    pieces: tuple[tuple[int, int], ...] = ()


def compress(rows: torch.Tensor, name: str) -> SparseRows:
    """A detached (B, V) embedding as its non-zeros (row by row, in order), or a TypeError naming `name` and the fix;
    its negative values are refused when the chunks are joined (`check_nonnegative`)."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
        what = f"shape {tuple(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise TypeError(
            f"sparse_cache=True caches (B, V) rows, but the encoder of {name} returned {what}; give sparse_cache "
            "only to encoders that return one 2-D nonnegative tensor per embedding (SPLADE's rows)."
        )
    where = rows.nonzero()  # (nnz, 2): the one host read of a chunk, its count
    return SparseRows(where.T.to(torch.int32).contiguous(), rows[where[:, 0], where[:, 1]], rows.shape)


def check_nonnegative(rows: SparseRows, name: str) -> None:
    """Raise a ValueError naming `name` and the fix if `rows` holds a negative value (one host read)."""
    negative = rows.values < 0
    if bool(negative.any()):
        raise ValueError(
            f"sparse_cache=True is exact only for rows that are 0 where a clamp at zero sends them (SPLADE's "
            f"max-pooled log(1 + relu(.)), relu), but the encoder of {name} returned {int(negative.sum())} negative "
            f"value(s) (min {rows.values.min().item():.4g}): its output is not nonnegative after its activation. "
            "Drop sparse_cache for this encoder (the dense cache is exact for any output)."
        )


def densify(sparse: SparseRows) -> torch.Tensor:
    """The (B, V) rows, differentiable with respect to `sparse.values` (phase (2)'s loss input)."""
    dense = sparse.values.new_zeros(sparse.size)
    return dense.index_put((sparse.indices[0].long(), sparse.indices[1].long()), sparse.values)  # (B, V)


def join_sparse(pieces: list[SparseRows]) -> SparseRows:
    """Chunks' sparse rows one under the other: (B_k, V) each -> (sum B_k, V), recording where each starts."""
    starts, row, non_zero = [], 0, 0
    for p in pieces:
        starts.append((row, non_zero))
        row, non_zero = row + p.size[0], non_zero + p.values.shape[0]
    indices = torch.cat([torch.stack([p.indices[0] + first, p.indices[1]]) for p, (first, _) in zip(pieces, starts)],
                        dim=1)  # (2, nnz): each piece's rows moved down by the rows above it
    return SparseRows(indices, torch.cat([p.values for p in pieces]), torch.Size((row, pieces[0].size[1])),
                      (*starts, (row, non_zero)))


def dense_piece(sparse: SparseRows, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop as a dense (stop - start, V) tensor: a chunk's cached embedding, or its gradient when
    `sparse.values` holds the gradient (0 at the zeros). Without a host read when start and stop are where joined
    pieces start (`SparseRows.pieces`) or the whole; elsewhere a boolean mask finds the rows (one read)."""
    dense = sparse.values.new_zeros((stop - start, sparse.size[1]))
    bounds = dict(sparse.pieces) if sparse.pieces else {0: 0}
    bounds.setdefault(sparse.size[0], sparse.values.shape[0])
    if start in bounds and stop in bounds:
        first, last = bounds[start], bounds[stop]
        rows, columns = sparse.indices[0][first:last].long() - start, sparse.indices[1][first:last].long()
        return dense.index_put((rows, columns), sparse.values[first:last])
    inside = (sparse.indices[0] >= start) & (sparse.indices[0] < stop)
    rows, columns = sparse.indices[0][inside].long() - start, sparse.indices[1][inside].long()
    return dense.index_put((rows, columns), sparse.values[inside])


def takes_sparse_rows(loss_fn: object) -> bool:
    """Whether `loss_fn` takes a sparse cache's rows as `SparseRows` (its attribute `takes_sparse_rows`, on a
    module or a function; a bound method reads its function's), rather than made dense."""
    return getattr(loss_fn, "takes_sparse_rows", False) is True
