"""The records of a text file in order, each with where it starts: what the row index records (row_index.py) and
what reading a file whole parses (pairs.py).

- `.jsonl`: one JSON object a non-blank line; a record starts where its line does. A line that is not JSON, or
  not an object, is a DataError naming the file and line.
- `.tsv` / `.csv`: parsed by `csv` (tab / comma) with the file's header row, so a quoted field may span lines: a
  record starts where the parser started it (it pulls lines one at a time from a reader that counts their bytes).
"""
from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from gradcache.train.errors import DataError

SEPARATORS = {".tsv": "\t", ".csv": ","}
JSON_LINES = ".jsonl"


def jsonl_records(file: Path, start: int = 0, end: int | None = None,
                  first_line: int = 1) -> Iterator[tuple[int, int, dict]]:
    """(byte offset, line number, record) of each non-blank line of the `.jsonl` `file` from byte `start` (a line's
    start, numbered `first_line`) to `end` (just after a newline, or the file's end: None)."""
    stop = sys.maxsize if end is None else end
    with open(file, "rb") as handle:
        handle.seek(start)
        offset = start
        for number, raw in enumerate(handle, start=first_line):
            if offset >= stop:
                return
            line_start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except ValueError as error:  # JSON and UTF-8 errors
                raise DataError(f"cannot read {file} line {number}: not JSON ({error})") from error
            if not isinstance(record, dict):
                raise DataError(f"{file} line {number} is not a JSON object")
            yield line_start, number, record


def file_records(file: Path, text_format: str, header_out: list) -> Iterator[tuple[int, int, dict]]:
    """(byte offset, line number, record) of each non-blank row of `file`; a table's header goes to header_out."""
    if text_format == JSON_LINES:
        yield from jsonl_records(file)
        return
    with open(file, "rb") as handle:
        position = [0]

        def lines() -> Iterator[str]:
            for raw in handle:
                position[0] += len(raw)
                yield raw.decode("utf-8")

        reader = csv.reader(lines(), delimiter=SEPARATORS[text_format])
        header = next(reader, None)
        header_out.append(header)
        if header is None:
            return
        width = len(header)
        while True:
            start, line = position[0], reader.line_num + 1
            fields = next(reader, None)
            if fields is None:
                return
            if not fields:  # a blank line, skipped as csv.DictReader skips it
                continue
            record = dict(zip(header, fields))
            if len(fields) > width:
                record[None] = fields[width:]
            for key in header[len(fields):]:
                record[key] = None
            yield start, line, record
