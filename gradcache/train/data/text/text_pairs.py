"""Rows of (query, positive passage, hard negatives) in memory (`TextPairs`), and a held-out split of rows.

- Every query has the same number h of hard negatives (the loss groups them by query).
- `TextSplits`: the training rows (in memory, read on demand through an index: indexed_pairs.py, or streamed:
  streamed_rows.py) and the held-out rows the evaluation scores; `split_pairs` holds out rows by a seeded
  permutation.
- Reading rows from files: sources.py (`read_text_pairs`: every usable row of a file, in memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradcache.train.data.held_out import held_out_order, held_out_size
from gradcache.train.errors import DataError


@dataclass
class TextPairs:
    """N training rows: `queries[i]` is answered by `positives[i]` and not by any of `negatives[i]` (h each)."""

    queries: list[str]
    positives: list[str]
    negatives: list[list[str]]
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        count = len(self.queries)
        if len(self.positives) != count or len(self.negatives) != count:
            raise ValueError(f"queries, positives and negatives must be as long, got {count}, "
                             f"{len(self.positives)} and {len(self.negatives)}")
        if len({len(row) for row in self.negatives}) > 1:
            raise ValueError("every row needs the same number of hard negatives")

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def negatives_per_query(self) -> int:
        return len(self.negatives[0]) if self.negatives else 0

    def row(self, index: int) -> tuple[str, str, list[str]]:
        """Row `index`: its query, positive and hard negatives."""
        return self.queries[index], self.positives[index], self.negatives[index]

    def subset(self, indices: torch.Tensor) -> TextPairs:
        picked = indices.tolist()
        return TextPairs([self.queries[i] for i in picked], [self.positives[i] for i in picked],
                         [self.negatives[i] for i in picked], list(self.skipped))


@dataclass
class TextSplits:
    """The training rows and the held-out rows that the retrieval evaluation scores."""

    train: TextPairs  # or IndexedPairs (indexed_pairs.py) or StreamedRows (streamed_rows.py)
    test: TextPairs
    name: str
    # --corpus: the retrieval corpus of the evaluation (a PassageCorpus) and (test,) each held-out positive's place
    corpus: object | None = None
    test_positions: object | None = None


def split_pairs(pairs: TextPairs, test_size: int | None, seed: int, name: str) -> TextSplits:
    """Hold out `test_size` rows (None: the default, `held_out_size`) chosen by a permutation that depends only on
    `seed`."""
    test_size = held_out_size(test_size, len(pairs), "rows")
    try:
        order = held_out_order(len(pairs), test_size, seed, "rows")
    except ValueError as error:
        raise DataError(str(error)) from error
    return TextSplits(train=pairs.subset(order[test_size:]), test=pairs.subset(order[:test_size]), name=name)


def check_negative_options(negative_keys: list[str] | tuple[str, ...], negatives_per_query: int | None) -> None:
    """Raises ValueError unless `negatives_per_query` is None or an int >= 0, with `negative_keys` if positive."""
    if negatives_per_query is not None and (isinstance(negatives_per_query, bool)
                                            or not isinstance(negatives_per_query, int) or negatives_per_query < 0):
        raise ValueError(f"negatives_per_query={negatives_per_query!r} must be None (the count most rows have) "
                         "or an int >= 0")
    if negatives_per_query and not negative_keys:
        raise ValueError(f"negatives_per_query={negatives_per_query} needs negative_keys naming the columns "
                         "that hold the hard negatives")
