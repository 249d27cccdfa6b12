"""Which (query, positive, hard negatives) rows can train, written once for every reader of text rows (the row
index of files, row_index.py, and the streamed formats, streamed_rows.py).

- A row is usable with a query, a positive and at least h non-empty hard negatives; it keeps its first h
  (`RowFields.unusable`). Hard negatives are the named columns' passages, a list-valued field's in order
  (`record_negatives`).
- h is `--negatives-per-query`, or else the count most of the first `FIRST_ROWS` (1,000) rows with a query and a
  positive have (all of them in a smaller set; `first_rows_negatives`).
- Unusable rows are skipped and counted as they are met (data/bad_data.py's `SkippedRows`: the count and the
  first ten reasons); a key that names no column is refused naming its option (`check_columns`), and with
  `--corpus` a passage id the corpus lacks (`check_ids`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gradcache.train.errors import DataError

if TYPE_CHECKING:
    from gradcache.train.data.text.corpus import PassageCorpus

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


class RowFields(NamedTuple):
    """A record's query, positive and every non-empty hard negative, cleaned: what decides if the row is usable."""

    query: str
    positive: str
    negatives: list[str]

    @property
    def empty(self) -> str:
        """The field a row cannot do without that is empty ("query" or "positive"), else ""."""
        return "query" if not self.query else "positive" if not self.positive else ""

    def unusable(self, h: int) -> str | None:
        """Why the row cannot train with `h` hard negatives (an empty query or positive, fewer than h non-empty
        negatives), or None: it is usable, and keeps its first h."""
        if self.empty:
            return f"empty {self.empty}"
        if len(self.negatives) < h:
            return f"{len(self.negatives)} of {h} hard negatives"
        return None


def row_fields(record: dict, keys: tuple[str, str, Sequence[str]]) -> RowFields:
    """The fields of `record` that `keys` (query key, positive key, negative keys) name."""
    query_key, positive_key, negative_keys = keys
    return RowFields(clean_text(record.get(query_key)), clean_text(record.get(positive_key)),
                     record_negatives(record, negative_keys))


def first_rows_negatives(records: Iterable[dict], keys: tuple[str, str, Sequence[str]]) -> int:
    """The default h: the count most of the first FIRST_ROWS `records` with a query and a positive have (all of
    them when there are fewer), the first met on a tie; 0 for no such record."""
    counts: Counter = Counter()
    for record in records:
        fields = row_fields(record, keys)
        if not fields.empty:
            counts[len(fields.negatives)] += 1
            if counts.total() >= FIRST_ROWS:
                break
    return counts.most_common(1)[0][0] if counts else 0


def no_usable_row(where: str, h: int, read: int | None = None) -> DataError:
    """The error of data without one usable row (`read` rows read, when known)."""
    counted = "" if read is None else f" ({read} rows read)"
    return DataError(f"{where} has no row with a query, a positive and {h} hard negatives{counted}; check the files "
                     "and the column options")


def check_columns(names: set, keys: tuple[str, str, Sequence[str]], where: str, option: str) -> None:
    """Refuse a key that names no column (field) of `names`, those of the rows `where` says, naming its option."""
    query_key, positive_key, negative_keys = keys
    for flag, key in [("--query-key", query_key), ("--positive-key", positive_key),
                      *[("--negative-keys", key) for key in negative_keys]]:
        if key not in names:
            fix = f"name it with {flag}" if option == "--data" else f"a {option} file needs the fields {keys[:2]}"
            raise DataError(f"{where} has no column {key!r} (columns: {sorted(names, key=str)}); {fix}")


def check_ids(corpus: PassageCorpus, passage_ids: list[str], file: Path | str, line: int) -> None:
    """Refuse (DataError naming the file, line and id) an id of `passage_ids` that `corpus` lacks."""
    for passage_id in passage_ids:
        if not corpus.contains_hash(passage_id):
            raise DataError(f"{file} line {line}: passage id {passage_id!r} is not in --corpus {corpus.name}; add "
                            "the passage to the corpus or fix the id")
