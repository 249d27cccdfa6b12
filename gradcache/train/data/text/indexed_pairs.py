"""Training rows read on demand: a `RowIndex` and the selection of its rows a split keeps (no text in memory).

`IndexedPairs` is to the batches what `TextPairs` is: `len`, `row(i)` -> (query, positive, h negatives),
`negatives_per_query`, `skipped`, `subset`; it keeps only `rows`, an int64 array of index positions (8 bytes a
row), and reads each row's text from its file when a data-loader worker asks for it. With a `corpus`
(`--corpus`), a row's positive and negatives are passage ids, and `row` returns the corpus's texts for them.
`materialize` reads the selection into a `TextPairs` (the held-out rows the evaluation embeds).
"""
from __future__ import annotations

import numpy as np
import torch

from gradcache.train.data.text.corpus import PassageCorpus
from gradcache.train.data.text.row_index import RowIndex
from gradcache.train.data.text.text_pairs import TextPairs


class IndexedPairs:
    """Rows `rows` (int64 positions into `index`) of an indexed set of files, read when asked for."""

    def __init__(self, index: RowIndex, rows: np.ndarray | None = None, corpus: PassageCorpus | None = None) -> None:
        self.index, self.corpus = index, corpus
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
        query, positive, negatives = self.index.row(int(self.rows[index]))
        if self.corpus is None:
            return query, positive, negatives
        return query, self.corpus.text(positive), [self.corpus.text(negative) for negative in negatives]

    def positive_positions(self) -> np.ndarray:
        """(N,) the corpus position of each selected row's positive (with a corpus only)."""
        return np.array([self.corpus.position(self.index.row(int(row))[1]) for row in self.rows], dtype=np.int64)

    def subset(self, indices: torch.Tensor | np.ndarray) -> IndexedPairs:
        picked = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        return IndexedPairs(self.index, self.rows[picked], self.corpus)

    def materialize(self) -> TextPairs:
        """Every selected row's text, in order, as a `TextPairs`."""
        pairs = TextPairs([], [], [], self.skipped)
        for position in range(len(self)):
            query, positive, negatives = self.row(position)
            pairs.queries.append(query)
            pairs.positives.append(positive)
            pairs.negatives.append(negatives)
        return pairs
