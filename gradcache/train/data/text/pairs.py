"""Rows of (query, positive passage, hard negatives) read from a TSV, CSV or JSONL file, and their held-out split.

- The format comes from the extension: `.tsv` (tab), `.csv` (comma), `.jsonl` (one JSON object a line).
- Columns are named by `query_key`, `positive_key` and `negative_keys` (zero or more). In JSONL a negative field
  may hold a list of passages; every row's negatives are its named columns' passages, in order.
- Every query needs the same number h of hard negatives (the loss groups them by query): h is
  `negatives_per_query`, by default the count most rows have; a row with more keeps its first h.
- Skip and count: a row with an empty query or positive, or with fewer than h non-empty negatives, is left out;
  a warning names the first ten and `TextPairs.skipped` keeps every one, so the run can report the count.
- A missing file, an unknown extension, a column no row has, or a file with no usable row raises `DataError`.
"""
from __future__ import annotations

import csv
import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gradcache.train.data.held_out import held_out_order
from gradcache.train.errors import DataError

SEPARATORS = {".tsv": "\t", ".csv": ","}
JSON_LINES = (".jsonl",)


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

    def subset(self, indices: torch.Tensor) -> TextPairs:
        picked = indices.tolist()
        return TextPairs([self.queries[i] for i in picked], [self.positives[i] for i in picked],
                         [self.negatives[i] for i in picked], list(self.skipped))


@dataclass
class TextSplits:
    """The training rows and the held-out rows that the retrieval evaluation scores."""

    train: TextPairs
    test: TextPairs
    name: str


def split_pairs(pairs: TextPairs, test_size: int, seed: int, name: str) -> TextSplits:
    """Hold out `test_size` rows chosen by a permutation that depends only on `seed`."""
    try:
        order = held_out_order(len(pairs), test_size, seed, "rows")
    except ValueError as error:
        raise DataError(str(error)) from error
    return TextSplits(train=pairs.subset(order[test_size:]), test=pairs.subset(order[:test_size]), name=name)


def _text(value: object) -> str:
    return "" if value is None else str(value).strip()


def _negatives(record: dict, keys: list[str]) -> list[str]:
    passages: list[str] = []
    for key in keys:
        value = record.get(key)
        values = value if isinstance(value, list) else [value]
        passages.extend(text for text in map(_text, values) if text)
    return passages


def read_records(path: Path, option: str = "--data") -> tuple[list[tuple[str, dict]], set[str]]:
    """(where, record) for every row of a TSV, CSV or JSONL table, and every column or field name seen; `option`
    names the file's option in errors."""
    suffix = path.suffix.lower()
    if suffix not in SEPARATORS and suffix not in JSON_LINES:
        raise DataError(f"{option} {str(path)!r}: unknown extension {suffix!r}; give a .tsv, .csv or .jsonl file")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            if suffix in SEPARATORS:
                reader = csv.DictReader(handle, delimiter=SEPARATORS[suffix])
                rows = [(f"line {number + 2}", record) for number, record in enumerate(reader)]
                return rows, set(reader.fieldnames or [])
            rows, names = [], set()
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise DataError(f"{path} line {number} is not a JSON object")
                    rows.append((f"line {number}", record))
                    names.update(record)
            return rows, names
    except (OSError, UnicodeDecodeError, csv.Error, json.JSONDecodeError) as error:
        raise DataError(f"cannot read {path}: {error}") from error


def read_text_pairs(path: str | os.PathLike, query_key: str = "query", positive_key: str = "positive",
                    negative_keys: list[str] | tuple[str, ...] = (),
                    negatives_per_query: int | None = None) -> TextPairs:
    """Every usable row of a TSV, CSV or JSONL file, as the module docstring says."""
    if negatives_per_query is not None and (isinstance(negatives_per_query, bool)
                                            or not isinstance(negatives_per_query, int) or negatives_per_query < 0):
        raise ValueError(f"negatives_per_query={negatives_per_query!r} must be None (the count most rows have) "
                         "or an int >= 0")
    if negatives_per_query and not negative_keys:
        raise ValueError(f"negatives_per_query={negatives_per_query} needs negative_keys naming the columns "
                         "that hold the hard negatives")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data {str(path)!r} is not a file; give a .tsv, .csv or .jsonl file of text pairs")
    rows, names = read_records(path)
    for option, key in [("--query-key", query_key), ("--positive-key", positive_key),
                        *[("--negative-keys", key) for key in negative_keys]]:
        if key not in names:
            raise DataError(f"{path} has no column {key!r} (columns: {sorted(names)}); name it with {option}")
    parsed = [(where, _text(record.get(query_key)), _text(record.get(positive_key)),
               _negatives(record, list(negative_keys))) for where, record in rows]
    counts = Counter(len(negatives) for _, query, positive, negatives in parsed if query and positive)
    if negatives_per_query is None:
        negatives_per_query = counts.most_common(1)[0][0] if counts else 0
    pairs, skipped = TextPairs([], [], []), []
    for where, query, positive, negatives in parsed:
        if not query or not positive:
            skipped.append(f"{where}: empty {'query' if not query else 'positive'}")
        elif len(negatives) < negatives_per_query:
            skipped.append(f"{where}: {len(negatives)} of {negatives_per_query} hard negatives")
        else:
            pairs.queries.append(query)
            pairs.positives.append(positive)
            pairs.negatives.append(negatives[:negatives_per_query])
    if skipped:
        shown = "; ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(f"skipped {len(skipped)} of {len(rows)} rows of {path}: {shown}", stacklevel=2)
    if not pairs.queries:
        raise DataError(f"{path} has no row with a query, a positive and {negatives_per_query} hard negatives "
                        f"({len(rows)} rows read); check the file and the column options")
    pairs.skipped = skipped
    return pairs
