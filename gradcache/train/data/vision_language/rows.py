"""The rows of `gradcache train vlm`: a query side, a positive side and h hard-negative sides, each a text, its
images or both (`RowSide`); the training rows with what was left out (`TrainingRows`); a run's training and
held-out rows (`VisionLanguageSplits`, which the loop reads through data/splits.py's `Splits`).

A side holds image *values* as the data holds them (a path string, a list of them; for datasets' `{"bytes", "path"}`
in a Parquet file or a datasets folder, where its bytes lie: `StoredImage`; PIL images for the built-in data),
never pixels nor image bytes: images open when a batch draws the row (opened_input.py), so the rows in memory cost
a few hundred bytes each.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from gradcache.train.data.bad_data import SkippedRows


@dataclass(frozen=True)
class RowSide:
    """One side of a row: its text, its image value(s), or both (`text` None: no text; `images` empty: none).

    `root` is the folder this side's relative image paths resolve under when it is not the splits' `image_root`
    (a row of --eval-data, or of a --data file in another folder); None: the root the reader is given."""

    text: str | None
    images: tuple[Any, ...] = ()
    root: Path | None = None

    @property
    def empty(self) -> bool:
        """Neither text nor an image."""
        return not self.text and not self.images


@dataclass(frozen=True)
class VisionLanguageRow:
    """A query, the positive that answers it and h hard negatives that do not; `where` names the row in messages
    ("rows.jsonl line 7", "train.parquet row 12", "built-in row 3")."""

    query: RowSide
    positive: RowSide
    negatives: tuple[RowSide, ...] = ()
    where: str = ""


class TrainingRows(Sequence[VisionLanguageRow]):
    """The training rows, in memory, with `skipped`: the rows left out when the data was read and, as the run goes,
    those whose images could not be opened (data/bad_data.py's `SkippedRows`: the count and the first reasons)."""

    def __init__(self, rows: list[VisionLanguageRow], skipped: SkippedRows | None = None) -> None:
        self.rows = rows
        self.skipped = SkippedRows() if skipped is None else skipped

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> VisionLanguageRow: ...

    @overload
    def __getitem__(self, index: slice) -> list[VisionLanguageRow]: ...

    def __getitem__(self, index):
        return self.rows[index]

    def __iter__(self) -> Iterator[VisionLanguageRow]:
        return iter(self.rows)


@dataclass(frozen=True)
class VisionLanguageSplits:
    """The data of one `gradcache train vlm` run (data/splits.py's `Splits`, and what the mode reads besides)."""

    train: TrainingRows  # len() = training rows; `skipped` = rows left out
    test: list[VisionLanguageRow]  # held out, in memory; never trained on
    name: str
    image_root: Path | None  # where relative image paths resolve (None: built-in data, images in memory)
    negatives_per_query: int  # h: hard negatives per row (every training row has exactly h)
