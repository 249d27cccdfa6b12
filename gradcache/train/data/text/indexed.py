"""Training rows read on demand: a `RowIndex` and the selection of its rows a split keeps (no text in memory).

`IndexedPairs` is to the batches what `TextPairs` is: `len`, `row(i)` -> (query, positive, h negatives),
`negatives_per_query`, `skipped`, `subset`; it keeps only `rows`, an int64 array of index positions (8 bytes a
row), and reads each row's text from its file when a data-loader worker asks for it. `materialize` reads the
selection into a `TextPairs` (the held-out rows the evaluation embeds).
"""
from __future__ import annotations

import numpy as np
import torch

from gradcache.train.data.text.pairs import TextPairs
from gradcache.train.data.text.row_index import RowIndex


class IndexedPairs:
    """Rows `rows` (int64 positions into `index`) of an indexed set of files, read when asked for."""

    def __init__(self, index: RowIndex, rows: np.ndarray | None = None) -> None:
        self.index = index
        self.rows = np.arange(len(index), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def negatives_per_query(self) -> int:
        return self.index.negatives_per_query

    @property
    def skipped(self):
        return self.index.skipped

    def row(self, index: int) -> tuple[str, str, list[str]]:
        return self.index.row(int(self.rows[index]))

    def subset(self, indices: torch.Tensor | np.ndarray) -> IndexedPairs:
        picked = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        return IndexedPairs(self.index, self.rows[picked])

    def materialize(self) -> TextPairs:
        """Every selected row's text, in order, as a `TextPairs`."""
        pairs = TextPairs([], [], [], self.skipped)
        for position in range(len(self)):
            query, positive, negatives = self.row(position)
            pairs.queries.append(query)
            pairs.positives.append(positive)
            pairs.negatives.append(negatives)
        return pairs
