"""A row index of text files: where each usable (query, positive, hard negatives) row starts, never its text.

One streamed pass over the files (in order) records the byte offset of every usable row in one int64 array
(8 bytes a row; a (files + 1,) array says which file a row is in); `row(i)` seeks there and parses that row
alone, so a data-loader worker reads and tokenises only the rows of its batches. Large `.jsonl` files (64 MB in
all) are indexed in min(cores, 8) forked processes, a byte range each, to the same result (`parallel_index.py`).

- The offset is what the file's format says (formats/): where the record starts in a `.jsonl`, `.tsv` or `.csv`
  file (a CSV record may span lines), the row's number in a `.parquet` file or a `datasets` folder; the
  format's reader reads the record at an offset.
- Usable rows by usable_rows.py's rule (which the streamed formats apply too): a query, a positive and at least h
  non-empty hard negatives, the first h kept; h by default the count most of the first 1,000 rows have.
  Unusable rows are skipped and counted as they are met.
- A streamed format (`.jsonl.gz`) is not indexed (it has no offsets to seek to): streamed_rows.py reads it.
- `save` / `load_row_index`: the index as .npz with the files' sizes and modification times and the options
  it was built under; a load that finds any of them changed returns None (the caller builds it again).
"""
from __future__ import annotations

import csv
import errno
import functools
import json
import os
import warnings
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gradcache.train.data.bad_data import SHOWN_SKIPS, SkippedRows
from gradcache.train.data.text.formats import IndexedFormat, described, format_named
from gradcache.train.data.text.formats.text_format import FileRecords, RecordReader
from gradcache.train.data.text.parallel_index import LineRange, map_line_ranges, parallel_processes
from gradcache.train.data.text.usable_rows import (
    FIRST_ROWS,
    PassageIds,
    check_columns,
    check_ids,
    clean_text,
    first_rows_negatives,
    no_usable_row,
    record_negatives,
    row_fields,
)
from gradcache.train.errors import DataDiskFull, DataError

_INDEX_VERSION = 1


class RowIndex:
    """The usable rows of `files` (module docstring): `len(index)` rows, `row(i)` -> (query, positive, negatives)."""

    def __init__(self, files: list[Path], text_format: IndexedFormat, headers: list[list[str] | None],
                 offsets: np.ndarray, file_ends: np.ndarray, keys: tuple[str, str, tuple[str, ...]],
                 requested: int | None, negatives_per_query: int, skipped: SkippedRows, rows_read: int,
                 stamps: list[tuple[int, int]]) -> None:
        self.files, self.text_format, self.headers = files, text_format, headers
        self.offsets, self.file_ends = offsets, file_ends  # (N,) int64 byte offsets; (files + 1,) row counts so far
        self.keys, self.requested, self.negatives_per_query = keys, requested, negatives_per_query
        self.skipped, self.rows_read, self.stamps = skipped, rows_read, stamps
        self.saved_at: Path | None = None  # where `save` wrote it, or `load_row_index` read it from
        self._readers: dict[int, RecordReader] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.offsets)

    def __getstate__(self) -> dict:  # a worker process opens its own file handles
        return {**self.__dict__, "_readers": {}}

    def _reader(self, file_number: int) -> RecordReader:
        if self._pid != os.getpid():  # forked: the parent's handles share its file positions
            self._readers, self._pid = {}, os.getpid()
        if file_number not in self._readers:
            self._readers[file_number] = self.text_format.reader(self.files[file_number], self.headers[file_number])
        return self._readers[file_number]

    def row(self, index: int) -> tuple[str, str, list[str]]:
        """Row `index` (0 <= index < len): its query, positive and first h hard negatives, read from its file."""
        file_number = int(np.searchsorted(self.file_ends, index, side="right")) - 1
        record = self._reader(file_number).record(int(self.offsets[index]))
        query_key, positive_key, negative_keys = self.keys
        negatives = record_negatives(record, negative_keys)[:self.negatives_per_query]
        return clean_text(record.get(query_key)), clean_text(record.get(positive_key)), negatives

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers = {}

    def __del__(self, getpid=os.getpid) -> None:  # bound now: at interpreter exit `os` may be gone already
        if getattr(self, "_pid", None) == getpid():
            self.close()

    # --- saved beside the run ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to `path` (.npz) atomically: a temporary file in the same folder, then a rename."""
        path = Path(path)
        meta = {"version": _INDEX_VERSION, "files": [str(file) for file in self.files],
                "format": self.text_format.name, "headers": self.headers,
                "keys": [self.keys[0], self.keys[1], list(self.keys[2])], "requested": self.requested,
                "negatives_per_query": self.negatives_per_query,
                "skipped": self.skipped.count, "skip_reasons": self.skipped.reasons, "rows_read": self.rows_read,
                "stamps": self.stamps, "first_rows": FIRST_ROWS}
        partial = path.with_name(path.name + ".partial")
        try:
            with open(partial, "wb") as handle:
                np.savez(handle, offsets=self.offsets, file_ends=self.file_ends, meta=np.array(json.dumps(meta)))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, path)
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno == errno.ENOSPC:
                raise DataDiskFull(errno.ENOSPC, f"no space left to save the data's row index {path} "
                                   f"({self.offsets.nbytes / 2**20:.1f} MiB); nothing was trained and no partial "
                                   "file is left. Free space, then run the same command again") from None
            raise
        self.saved_at = path


def file_stamps(files: Sequence[Path]) -> list[tuple[int, int]]:
    """(size in bytes, modification time in ns) of each file (a folder: the sum and the latest of its files'):
    what invalidates a saved index."""
    stamps = []
    for file in map(Path, files):
        stats = [os.stat(part) for part in sorted(file.iterdir()) if part.is_file()] if file.is_dir() else [
            os.stat(file)]
        stamps.append((sum(stat.st_size for stat in stats), max((stat.st_mtime_ns for stat in stats), default=0)))
    return stamps


def load_row_index(path: str | os.PathLike, files: Sequence[Path], keys: tuple[str, str, tuple[str, ...]],
                   requested: int | None) -> RowIndex | None:
    """The index saved at `path` if it indexes exactly `files`, unchanged, under the same options (`requested`
    None or the h it resolved to, for a resume's configuration holds the resolved h); else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            meta = json.loads(str(saved["meta"]))
            offsets, file_ends = saved["offsets"], saved["file_ends"]
    except (OSError, ValueError, KeyError):
        return None
    same = (meta.get("version") == _INDEX_VERSION and meta["files"] == [str(file) for file in files]
            and [tuple(stamp) for stamp in meta["stamps"]] == file_stamps(files)
            and meta["keys"] == [keys[0], keys[1], list(keys[2])]
            # a resumed run's configuration holds the h the index resolved to, which indexes the same rows
            and requested in (meta["requested"], meta["negatives_per_query"])
            and meta["first_rows"] == FIRST_ROWS)
    text_format = format_named(meta["format"])
    if not same or not isinstance(text_format, IndexedFormat):
        return None
    index = RowIndex(list(files), text_format, meta["headers"], offsets, file_ends, keys, requested,
                     meta["negatives_per_query"], SkippedRows(meta["skipped"], meta["skip_reasons"]),
                     meta["rows_read"], [tuple(stamp) for stamp in meta["stamps"]])
    index.saved_at = path
    return index


# --- the one streamed pass ----------------------------------------------------------------------------------
class RowRule(NamedTuple):
    """How the pass judges and names every row, the same in each file and process."""

    keys: tuple[str, str, tuple[str, ...]]
    negatives_per_query: int  # h, decided before the pass
    text_format: IndexedFormat
    skip_reasons: int | None  # reasons kept (all when None)
    corpus: PassageIds | None


class PieceIndex(NamedTuple):
    """What the pass found in one piece of the files (a file, or a byte range of a `.jsonl`)."""

    file_number: int
    offsets: np.ndarray  # (usable rows,) int64
    skipped: SkippedRows
    names: set  # the columns (fields) of its rows
    rows_read: int


def index_rows(file_number: int, file: Path, records: FileRecords, rule: RowRule,
               on_kept: Callable[[dict], None] | None = None) -> PieceIndex:
    """The usable rows of `records` (`file`'s, in order) under `rule`; `on_kept(record)` for each.

    Raises:
        DataError: at the first row that cannot be read or parsed, or an id the corpus lacks.
    """
    offsets = array("q")  # 8 bytes a row while building too
    skipped = SkippedRows(keep=rule.skip_reasons)
    rows_read = 0
    unit = rule.text_format.unit
    keys, h, corpus = rule.keys, rule.negatives_per_query, rule.corpus  # looked up once, not a row
    try:
        for offset, line, record in records:
            rows_read += 1
            fields = row_fields(record, keys)
            if corpus is not None and not fields.empty:
                check_ids(corpus, [fields.positive, *fields.negatives], file, line)
            reason = fields.unusable(h)
            if reason is not None:
                skipped.add(f"{file.name} {unit} {line}: {reason}")  # as a stream names it
            else:
                offsets.append(offset)
                if on_kept is not None:
                    on_kept(record)
    except DataError:
        raise
    except (OSError, ValueError, csv.Error) as error:  # UTF-8, csv and pyarrow's errors are ValueErrors
        raise DataError(f"cannot read {file}: {error}") from error
    return PieceIndex(file_number, np.frombuffer(offsets, dtype=np.int64), skipped, set(records.names), rows_read)


def index_line_range(rule: RowRule, line_range: LineRange) -> PieceIndex:
    """The usable rows of a byte range of a file whose format may be cut at newlines (parallel_index.py's task)."""
    file = Path(line_range.path)
    records = rule.text_format.records_between(file, line_range.start, line_range.end, line_range.first_line)
    return index_rows(line_range.file_number, file, records, rule)


def index_file(file_number: int, file: Path, rule: RowRule,
               on_kept: Callable[[dict], None] | None = None) -> tuple[PieceIndex, list[str] | None]:
    """The usable rows of `file` and the header its format's reader needs."""
    records = rule.text_format.records(file, rule.keys)
    return index_rows(file_number, file, records, rule, on_kept), records.header


def _head_records(files: Sequence[Path], text_format: IndexedFormat, keys: tuple[str, str, tuple[str, ...]]
                  ) -> Iterator[dict]:
    """The records of `files` in order, up to the first that cannot be read: what the default h is read from (the
    pass over every row then meets that row and raises its error, naming it)."""
    try:
        for file in files:
            for _, _, record in text_format.records(file, keys):
                yield record
    except (DataError, OSError, ValueError, csv.Error):
        return


def build_row_index(files: Sequence[Path], format_name: str, query_key: str = "query",
                    positive_key: str = "positive", negative_keys: Sequence[str] = (),
                    negatives_per_query: int | None = None, warn: bool = True,
                    skip_reasons: int | None = SHOWN_SKIPS, on_kept: Callable[[dict], None] | None = None,
                    corpus: PassageIds | None = None, option: str = "--data") -> RowIndex:
    """Index the usable rows of `files` (all of the format named `format_name`) as the module docstring says: h
    first (given, or from the head of the files), then every row under it, in one pass or, for large `.jsonl`
    files, in byte ranges in parallel processes (parallel_index.py), with the same result.

    `on_kept(record)` is called with each usable row, in order (in this process: the serial pass); with `corpus`,
    the positive and negatives are passage ids that must be in it (corpus.py).

    Raises:
        DataError: a format that is not indexed, a file that cannot be read or parsed (the first bad row in file
            order), a column no row has (naming the option), an id `corpus` lacks, or no usable row.
    """
    text_format = format_named(format_name)
    if not isinstance(text_format, IndexedFormat):
        raise DataError(f"{option} {str(files[0])!r}: unknown extension {format_name!r}; give "
                        f"{described(streamed=False)}")
    keys = (query_key, positive_key, tuple(negative_keys))
    h = (first_rows_negatives(_head_records(files, text_format, keys), keys) if negatives_per_query is None
         else negatives_per_query)
    rule = RowRule(keys, h, text_format, skip_reasons, corpus)
    # on_kept wants every usable record, in order, here: the serial pass
    processes = parallel_processes(files) if text_format.cut_at_newlines and on_kept is None else 1
    if processes > 1:
        pieces = map_line_ranges(functools.partial(index_line_range, rule), files, processes)
        headers: list = [None] * len(files)
    else:
        pieces, headers = [], []
        for file_number, file in enumerate(files):
            piece, header = index_file(file_number, file, rule, on_kept)
            pieces.append(piece)
            headers.append(header)
    skipped = SkippedRows(keep=skip_reasons)
    kept = np.zeros(len(files), dtype=np.int64)  # usable rows of each file
    for piece in pieces:
        skipped.merge(piece.skipped)
        kept[piece.file_number] += len(piece.offsets)
    names = set().union(*(piece.names for piece in pieces))
    rows_read = sum(piece.rows_read for piece in pieces)
    where_name = str(files[0]) if len(files) == 1 else f"{len(files)} files ({files[0]} ...)"
    check_columns(names, keys, where_name, option)
    if skipped and warn:
        warnings.warn(skipped.summary(rows_read, where_name), stacklevel=3)
    if not kept.sum():
        raise no_usable_row(where_name, h, rows_read, skipped[0] if skipped.reasons else "")
    offsets = pieces[0].offsets if len(pieces) == 1 else np.concatenate([piece.offsets for piece in pieces])
    file_ends = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return RowIndex(list(files), text_format, headers, offsets, file_ends, keys, negatives_per_query, h, skipped,
                    rows_read, file_stamps(files))
