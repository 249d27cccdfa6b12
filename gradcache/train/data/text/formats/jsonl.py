"""`.jsonl`: one JSON object a non-blank line. A record starts where its line does; a line that is not JSON, or
not an object, is a DataError naming the file and line. A file may be cut at any newline (parallel_index.py)."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from gradcache.train.data.text.formats.text_format import IndexedFormat, Keys, Record
from gradcache.train.errors import DataError


def json_value(raw: bytes | str) -> object:
    """The JSON value of one line; ValueError for a line that is not UTF-8 or not JSON, and for one nested
    deeper than the parser's recursion allows (`[[[...]]]`: a hostile line, never a row)."""
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except RecursionError:
        raise ValueError("nested deeper than the JSON reader allows") from None


class JsonlRecords:
    """The records of the `.jsonl` `file` from byte `start` (a line's start, numbered `first_line`) to `end` (just
    after a newline, or the file's end: None); `names` gathers their fields."""

    header = None

    def __init__(self, file: Path, start: int = 0, end: int | None = None, first_line: int = 1) -> None:
        self.file, self.start, self.end, self.first_line = file, start, end, first_line
        self.names: set[str] = set()

    def __iter__(self) -> Iterator[Record]:
        stop = sys.maxsize if self.end is None else self.end
        with open(self.file, "rb") as handle:
            handle.seek(self.start)
            offset = self.start
            for number, raw in enumerate(handle, start=self.first_line):
                if offset >= stop:
                    return
                line_start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                try:
                    record = json_value(raw)
                except ValueError as error:  # JSON and UTF-8 errors
                    raise DataError(f"cannot read {self.file} line {number}: not JSON ({error})") from error
                if not isinstance(record, dict):
                    raise DataError(f"{self.file} line {number} is not a JSON object")
                self.names.update(record)
                yield line_start, number, record


class JsonlReader:
    """The record of the line at a byte offset."""

    def __init__(self, file: Path) -> None:
        self.handle = open(file, "rb")  # noqa: SIM115 - held for the index's life

    def record(self, offset: int) -> dict:
        self.handle.seek(offset)
        return json_value(self.handle.readline())

    def close(self) -> None:
        self.handle.close()


class Jsonl(IndexedFormat):
    name = ".jsonl"
    suffixes = (".jsonl",)
    cut_at_newlines = True
    text_table = True
    holds_lists = True

    def records(self, file: Path, keys: Keys, every_column: bool = False) -> JsonlRecords:
        return JsonlRecords(file)

    def records_between(self, file: Path, start: int, end: int, first_line: int) -> JsonlRecords:
        """The records of bytes [start, end) of `file`, whose first line is `first_line`."""
        return JsonlRecords(file, start, end, first_line)

    def reader(self, file: Path, header: list[str] | None) -> JsonlReader:
        return JsonlReader(file)

    def write(self, handle: TextIO, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
        handle.writelines(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n" for row in rows)


JSONL = Jsonl()
