"""Which (query, positive, hard negatives) rows can train, written once for every reader of text rows (the row
index of files, row_index.py, and the streamed formats, streamed_rows.py).

- A row is usable with a query, a positive and at least h non-empty hard negatives; it keeps its first h
  (`RowFields.unusable`). Hard negatives are the named columns' passages, a list-valued field's in order
  (`record_negatives`).
- A field is text or null (empty), in every format: a number, a list (a query's or positive's), a mapping or a
  boolean is never turned into text with `str()`; the row is skipped and counted, its reason naming the column
  and the type (`not_text`). A negative column may hold a list of texts.
- h is `--negatives-per-query`, or else the count most of the first `FIRST_ROWS` (1,000) rows with a query and a
  positive have (all of them in a smaller set; `first_rows_negatives`).
- Unusable rows are skipped and counted as they are met (data/bad_data.py's `SkippedRows`: the count and the
  first ten reasons); a key that names no column is refused naming its option (`check_columns`), and with
  `--corpus` a passage id the corpus lacks (`check_ids`). A column named like hard negatives that no key names
  is trained without, with a warning naming `--negative-keys` (`unused_negatives`).
"""
from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from gradcache.train.errors import DataError

NEGATIVE_COLUMN = re.compile(r"(hard_?)?negatives?([_-]?\d+)?", re.IGNORECASE)  # a column named like negatives
FIRST_ROWS = 1_000  # the default h is the count most of the first FIRST_ROWS rows with a query and positive have


def clean_text(value: object) -> str:
    return "" if value is None else str(value).strip()


def record_negatives(record: dict, keys: Sequence[str]) -> list[str]:
    """The non-empty hard negatives of `record`: its `keys` columns' passages, a list-valued field's in order."""
    passages: list[str] = []
    for key in keys:
        value = record.get(key)
        values = value if isinstance(value, list) else [value]
        passages.extend(text for text in map(clean_text, values) if text)
    return passages


def not_text(record: dict, keys: tuple[str, str, Sequence[str]]) -> str:
    """Why a field of `record` that `keys` name is not text (nor null, nor a negative's list of texts): the
    column and the type, e.g. "column 'query' holds int, not text"; "" when every one is."""
    query_key, positive_key, negative_keys = keys
    for key in (query_key, positive_key, *negative_keys):
        value = record.get(key)
        if value is None or isinstance(value, str):
            continue
        if key in negative_keys and isinstance(value, list):
            wrong = [item for item in value if item is not None and not isinstance(item, str)]
            if wrong:
                return f"column {key!r} holds a list with {type(wrong[0]).__name__}, not text"
            continue
        return f"column {key!r} holds {type(value).__name__}, not text"
    return ""


class RowFields(NamedTuple):
    """A record's query, positive and every non-empty hard negative, cleaned: what decides if the row is usable;
    `not_text`, why a field is not text (`not_text`), else ""."""

    query: str
    positive: str
    negatives: list[str]
    not_text: str = ""

    @property
    def empty(self) -> str:
        """The field a row cannot do without that is empty ("query" or "positive"), else ""."""
        return "query" if not self.query else "positive" if not self.positive else ""

    def unusable(self, h: int) -> str | None:
        """Why the row cannot train with `h` hard negatives (an empty query or positive, fewer than h non-empty
        negatives, a field that is not text), or None: it is usable, and keeps its first h."""
        if self.not_text:
            return self.not_text
        if self.empty:
            return f"empty {self.empty}"
        if len(self.negatives) < h:
            return f"{len(self.negatives)} of {h} hard negatives"
        return None


def row_fields(record: dict, keys: tuple[str, str, Sequence[str]]) -> RowFields:
    """The fields of `record` that `keys` (query key, positive key, negative keys) name."""
    query_key, positive_key, negative_keys = keys
    return RowFields(clean_text(record.get(query_key)), clean_text(record.get(positive_key)),
                     record_negatives(record, negative_keys), not_text(record, keys))


def first_rows_negatives(records: Iterable[dict], keys: tuple[str, str, Sequence[str]]) -> int:
    """The default h: the count most of the first FIRST_ROWS `records` with a query and a positive have (all of
    them when there are fewer), the first met on a tie; 0 for no such record."""
    counts: Counter = Counter()
    for record in records:
        fields = row_fields(record, keys)
        if not fields.empty and not fields.not_text:
            counts[len(fields.negatives)] += 1
            if counts.total() >= FIRST_ROWS:
                break
    return counts.most_common(1)[0][0] if counts else 0


def no_usable_row(where: str, h: int, read: int | None = None, first_skip: str = "") -> DataError:
    """The error of data without one usable row (`read` rows read, when known; `first_skip`, the reason the first
    row was left out, when known)."""
    counted = "" if read is None else f" ({read} rows read)"
    first = f"; the first left out: {first_skip}" if first_skip else ""
    return DataError(f"{where} has no row with a query, a positive and {h} hard negatives{counted}{first}; check the "
                     "files and the column options")


def unused_negatives(names: set, keys: tuple[str, str, Sequence[str]]) -> list[str]:
    """The columns of `names` named like hard negatives (`negative`, `negatives`, `negative_1`, `hard_negatives`
    ...; `NEGATIVE_COLUMN`) that no key of `keys` names, in natural order."""
    named = {keys[0], keys[1], *keys[2]}
    found = [name for name in names if isinstance(name, str) and NEGATIVE_COLUMN.fullmatch(name) and name not in named]
    return sorted(found, key=lambda name: (len(name), name))


class UnusedNegatives(UserWarning):
    """Columns named like hard negatives that no --negative-keys names (a command that keeps them silences it)."""


def warn_unused_negatives(names: set, keys: tuple[str, str, Sequence[str]], where: str) -> None:
    """Warn (`UnusedNegatives`) of the columns of `names` (the rows of `where`) named like hard negatives that no
    key of `keys` names: the run would train without them."""
    unused = unused_negatives(names, keys)
    if unused:
        columns = ", ".join(repr(name) for name in unused)
        warnings.warn(f"{where} has hard-negative columns that no --negative-keys names ({columns}): the run trains "
                      f"without them. To train with them, pass --negative-keys {' '.join(unused)}", UnusedNegatives,
                      stacklevel=4)


def check_columns(names: set, keys: tuple[str, str, Sequence[str]], where: str, option: str) -> None:
    """Refuse a key that names no column (field) of `names`, those of the rows `where` says, naming its option;
    warn (once: the check runs once per data set) of columns named like hard negatives that no key names, which
    the run would train without."""
    warn_unused_negatives(names, keys, where)
    query_key, positive_key, negative_keys = keys
    for flag, key in [("--query-key", query_key), ("--positive-key", positive_key),
                      *[("--negative-keys", key) for key in negative_keys]]:
        if key not in names:
            fix = f"name it with {flag}" if option == "--data" else f"a {option} file needs the fields {keys[:2]}"
            raise DataError(f"{where} has no column {key!r} (columns: {sorted(names, key=str)}); {fix}")


class PassageIds(Protocol):
    """What reading training rows asks of a `--corpus` (a `PassageCorpus`, corpus.py, which reads its rows with
    this module and row_index.py): its name, and whether it holds an id."""

    name: str

    def contains_hash(self, passage_id: str) -> bool: ...


def check_ids(corpus: PassageIds, passage_ids: list[str], file: Path | str, line: int) -> None:
    """Refuse (DataError naming the file, line and id) an id of `passage_ids` that `corpus` lacks."""
    for passage_id in passage_ids:
        if not corpus.contains_hash(passage_id):
            raise DataError(f"{file} line {line}: passage id {passage_id!r} is not in --corpus {corpus.name}; add "
                            "the passage to the corpus or fix the id")
