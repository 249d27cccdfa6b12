"""Sparse rows of texts in compressed-sparse-row (CSR) form, and their `.npz` file (docs/outputs.md).

A SPLADE model gives each text a vocabulary-sized row that is mostly 0; the rows are kept by their non-zeros:
row i's columns are `indices[indptr[i]:indptr[i + 1]]` (ascending) and its values the same slice of `data`.
The file is NumPy's `.npz` with exactly those four arrays, readable without scipy (`numpy.load`), and by scipy as
`scipy.sparse.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=tuple(f["shape"]))`:

    indptr  (N + 1,) int64      indices (nnz,) int64      data (nnz,) float32      shape (2,) int64 = (N, V)
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

CSR_ARRAYS = ("indptr", "indices", "data", "shape")


@dataclass(frozen=True)
class CsrRows:
    """(N, V) nonnegative rows by their non-zeros (module docstring)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, rows: torch.Tensor) -> CsrRows:
        """The non-zeros of (N, V) rows, as float32."""
        rows = rows.detach().float().cpu()
        where = rows.nonzero()  # (nnz, 2), row-major: by row, then ascending column
        counts = torch.bincount(where[:, 0], minlength=rows.shape[0])  # (N,)
        indptr = np.concatenate([[0], np.cumsum(counts.numpy())]).astype(np.int64)
        return cls(indptr, where[:, 1].numpy().astype(np.int64), rows[where[:, 0], where[:, 1]].numpy(),
                   (int(rows.shape[0]), int(rows.shape[1])))

    @classmethod
    def stacked(cls, parts: Sequence[CsrRows], width: int) -> CsrRows:
        """`parts` one under the other ((0, width) rows for none)."""
        if not parts:
            return cls(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), (0, width))
        offsets = np.cumsum([0] + [len(part.data) for part in parts[:-1]])
        indptr = np.concatenate([[0]] + [part.indptr[1:] + offset for part, offset in zip(parts, offsets)])
        return cls(indptr.astype(np.int64), np.concatenate([part.indices for part in parts]),
                   np.concatenate([part.data for part in parts]), (sum(part.shape[0] for part in parts), width))

    def taken(self, order: Sequence[int]) -> CsrRows:
        """Rows `order[0]`, `order[1]` ... of these rows."""
        order = np.asarray(order, dtype=np.int64)
        starts, lengths = self.indptr[:-1][order], np.diff(self.indptr)[order]
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # entry k of the new row r sits at starts[r] + k: position in the output minus the row's output start
        where = np.arange(indptr[-1]) + np.repeat(starts - indptr[:-1], lengths)
        return CsrRows(indptr, self.indices[where], self.data[where], (len(order), self.shape[1]))

    def nonzeros_per_row(self) -> np.ndarray:
        """(N,) the non-zeros of each row."""
        return np.diff(self.indptr)

    def to_torch(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """A torch sparse COO (N, V) tensor of the rows in `dtype`."""
        rows = torch.from_numpy(np.repeat(np.arange(self.shape[0]), self.nonzeros_per_row()))
        indices = torch.stack([rows, torch.from_numpy(self.indices)])  # (2, nnz)
        return torch.sparse_coo_tensor(indices, torch.from_numpy(self.data).to(dtype), self.shape,
                                       is_coalesced=True, check_invariants=False)

    def to_dense(self) -> np.ndarray:
        """The (N, V) float32 rows, zeros included."""
        dense = np.zeros(self.shape, np.float32)
        dense[np.repeat(np.arange(self.shape[0]), self.nonzeros_per_row()), self.indices] = self.data
        return dense

    def save(self, path: str | os.PathLike) -> None:
        """The `.npz` file of the module docstring (uncompressed: the values are already only the non-zeros)."""
        with open(path, "wb") as handle:
            np.savez(handle, indptr=self.indptr, indices=self.indices, data=self.data,
                     shape=np.array(self.shape, dtype=np.int64))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CsrRows:
        with np.load(path) as saved:
            return cls(saved["indptr"], saved["indices"], saved["data"], tuple(int(n) for n in saved["shape"]))
