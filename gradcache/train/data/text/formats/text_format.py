"""What every text format answers (formats/__init__.py registers each in `FORMATS`).

- `name`: the format's key, which data_index.npz records (a file format's suffix, '.jsonl').
- `suffixes`: the (lower-case) file suffixes it reads; `is_folder(path)`: whether a folder is one data set of it,
  and `folder` what such a folder is called in messages.
- Indexed (`IndexedFormat`): `records(file, keys)`, the records of one file in order, each with its offset (where
  a byte offset, or a row number, lets a reader find it again) and its line or row number; `reader(file,
  header)`, which reads the record at an offset. The row index (row_index.py) keeps only the offsets. A
  `text_table` format (a text file the commands read whole) also writes rows (`write`).
- Streamed (`StreamedFormat`): compressed JSON lines with no offsets to seek to; `lines(path, first_line)`
  iterates a file's lines from a line on (streamed_rows.py parses them).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol, TextIO

from gradcache.train.data.streams import Damaged

Record = tuple[int, int, dict]  # (offset, line or row number, record)
Keys = tuple[str, str, Sequence[str]]  # query key, positive key, negative keys


class FileRecords(Protocol):
    """One file's records, in order. Once iterated, `header` is what the format's reader needs (a table's header
    row; None for JSON lines) and `names` the columns (fields) met."""

    header: list[str] | None
    names: set[str]

    def __iter__(self) -> Iterator[Record]: ...


class RecordReader(Protocol):
    """Reads one file's records by offset."""

    def record(self, offset: int) -> dict: ...

    def close(self) -> None: ...


class IndexedFormat:
    """A format whose records a reader finds again by offset (module docstring)."""

    name: str
    suffixes: tuple[str, ...] = ()
    folder: str | None = None  # what one data set folder of the format is called in messages ('a datasets folder')
    streamed = False
    unit = "line"  # what a record is called in messages: "line 7", "row 7"
    cut_at_newlines = False  # a file may be cut at any newline and its pieces indexed apart (parallel_index.py)
    text_table = False  # a text file of records that `gradcache encode`, `eval` and `mine` read (and write) whole
    holds_lists = False  # a field may hold a list (of hard negatives)

    def is_folder(self, path: Path) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<indexed text format {self.name}>"

    def records(self, file: Path, keys: Keys, every_column: bool = False) -> FileRecords:
        """The records of `file`: every field of a text file's; a columnar file's columns of `keys` that it has,
        or, with `every_column`, all of them."""
        raise NotImplementedError

    def reader(self, file: Path, header: list[str] | None) -> RecordReader:
        raise NotImplementedError

    def write(self, handle: TextIO, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
        """Write `rows` (values in the order of `columns`) to the text `handle` (a `text_table` format)."""
        raise NotImplementedError


class StreamedFormat:
    """Compressed JSON lines, read in order only: `open` and the errors a damaged file raises are the format's."""

    name: str
    suffixes: tuple[str, ...] = ()
    folder: str | None = None
    streamed = True
    text_table = False
    read_errors: tuple[type[BaseException], ...] = (OSError, EOFError)  # a file cut short ends in EOFError
    decompress_command = ""  # what turns a file into the plain .jsonl that an index needs

    def is_folder(self, path: Path) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<streamed text format {self.name}>"

    def open(self, path: str | os.PathLike) -> BinaryIO:
        raise NotImplementedError

    def lines(self, path: str, first_line: int = 1) -> Iterator[tuple[str, int, bytes] | Damaged]:
        """(path, line number, bytes) of each non-blank line of `path` from line `first_line` on, in order; a
        `Damaged` last when the file cannot be read to its end, naming the file, the line and the format's error."""
        number = 0
        try:
            with self.open(path) as handle:
                for number, raw in enumerate(handle, start=1):
                    if number >= first_line and raw.strip():
                        yield path, number, raw
        except self.read_errors as error:
            check = f"; `{self.decompress_command} -t FILE` checks it" if self.decompress_command else ""
            yield Damaged(f"{path} (unreadable after line {number}, truncated or damaged: {error}{check})")


TextFormat = IndexedFormat | StreamedFormat
