"""Rows of (query, positive passage, hard negatives) read from TSV, CSV or JSONL files, and their held-out split.

- The format comes from the extension: `.tsv` (tab), `.csv` (comma), `.jsonl` (one JSON object a line), `.jsonl.gz`
  (the same, gzipped); one file, or a folder or pattern of them (`files.py`), read through a row index
  (`row_index.py`), a `.jsonl.gz` streamed (`gzip_rows.py`).
- Columns are named by `query_key`, `positive_key` and `negative_keys` (zero or more). In JSONL a negative field
  may hold a list of passages; every row's negatives are its named columns' passages, in order.
- Every query needs the same number h of hard negatives (the loss groups them by query): h is
  `negatives_per_query`, by default the count most of the first 1,000 rows have (`rows.FIRST_ROWS`); a row
  with more keeps its first h.
- Skip and count: a row with an empty query or positive, or with fewer than h non-empty negatives, is left out;
  a warning names the first ten and `TextPairs.skipped` keeps every one, so the run can report the count.
- A missing file, an unknown extension, a column no row has, or a file with no usable row raises `DataError`.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gradcache.train.data.held_out import held_out_order
from gradcache.train.data.text.records import JSON_LINES, SEPARATORS, file_records
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

    train: TextPairs  # or IndexedPairs (indexed.py): the same rows, read on demand
    test: TextPairs
    name: str
    # --corpus: the retrieval corpus of the evaluation (a PassageCorpus) and (test,) each held-out positive's place
    corpus: object | None = None
    test_positions: object | None = None


def split_pairs(pairs: TextPairs, test_size: int, seed: int, name: str) -> TextSplits:
    """Hold out `test_size` rows chosen by a permutation that depends only on `seed`."""
    try:
        order = held_out_order(len(pairs), test_size, seed, "rows")
    except ValueError as error:
        raise DataError(str(error)) from error
    return TextSplits(train=pairs.subset(order[test_size:]), test=pairs.subset(order[:test_size]), name=name)


def read_text_pairs(path: str | os.PathLike, query_key: str = "query", positive_key: str = "positive",
                    negative_keys: list[str] | tuple[str, ...] = (),
                    negatives_per_query: int | None = None) -> TextPairs:
    """Every usable row of a TSV, CSV, JSONL or JSONL.gz file (or a folder or pattern of them: `files.py`), in
    memory, as the module docstring says; training reads rows on demand instead (`row_index.py`, `indexed.py`)
    or streams them (`gzip_rows.py`)."""
    from gradcache.train.data.text.files import data_files
    from gradcache.train.data.text.gzip_rows import GZIP, read_rows
    from gradcache.train.data.text.indexed import IndexedPairs
    from gradcache.train.data.text.row_index import build_row_index

    check_negative_options(negative_keys, negatives_per_query)
    files, text_format = data_files(path)
    if text_format == GZIP:  # no offsets to index: read whole
        rows = read_rows(files, (query_key, positive_key, tuple(negative_keys)), negatives_per_query,
                         skip_reasons=None)
        pairs = IndexedPairs(rows).materialize()
    else:
        index = build_row_index(files, text_format, query_key, positive_key, negative_keys, negatives_per_query,
                                skip_reasons=None)
        pairs = IndexedPairs(index).materialize()
        index.close()
    pairs.skipped = list(pairs.skipped)
    return pairs


def check_negative_options(negative_keys: list[str] | tuple[str, ...], negatives_per_query: int | None) -> None:
    """Raises ValueError unless `negatives_per_query` is None or an int >= 0, with `negative_keys` if positive."""
    if negatives_per_query is not None and (isinstance(negatives_per_query, bool)
                                            or not isinstance(negatives_per_query, int) or negatives_per_query < 0):
        raise ValueError(f"negatives_per_query={negatives_per_query!r} must be None (the count most rows have) "
                         "or an int >= 0")
    if negatives_per_query and not negative_keys:
        raise ValueError(f"negatives_per_query={negatives_per_query} needs negative_keys naming the columns "
                         "that hold the hard negatives")


def read_records(path: Path, option: str = "--data") -> tuple[list[tuple[str, dict]], set[str]]:
    """(where, record) for every row of a TSV, CSV or JSONL table, and every column or field name seen; `option`
    names the file's option in errors. Every record in memory: for small files (the commands' inputs)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SEPARATORS and suffix != JSON_LINES:
        raise DataError(f"{option} {str(path)!r}: unknown extension {suffix!r}; give a .tsv, .csv or .jsonl file")
    header: list = []
    try:
        rows = [(f"line {line}", record) for _, line, record in file_records(path, suffix, header)]
    except DataError:
        raise
    except (OSError, ValueError, csv.Error) as error:
        raise DataError(f"cannot read {path}: {error}") from error
    names = set(header[0] or []) if header else {name for _, record in rows for name in record}
    return rows, names
