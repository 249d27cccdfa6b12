"""`.tsv` and `.csv`: a table parsed by `csv` (tab or comma) with the file's header row. A quoted field may span
lines, so a record starts where the parser started it (it pulls lines one at a time from a reader that counts
their bytes); reading a record seeks there and parses one record with the header.

A record over several lines must be well-formed: its quoted field closes where a field ends. A quote that does
not (it runs to the end of the file, or closes mid-field at a later row's stray quote) has swallowed the rows
after it into one field, so it is a DataError naming the file and the line where the quote opens, not rows
quietly lost."""
from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from gradcache.train.data.text.formats.text_format import IndexedFormat, Keys, Record
from gradcache.train.errors import DataError


class DelimitedRecords:
    """The non-blank rows of a table `file` as records of its header's columns (`header` once read)."""

    def __init__(self, file: Path, separator: str) -> None:
        self.file, self.separator = file, separator
        self.header: list[str] | None = None
        self.names: set[str] = set()

    def __iter__(self) -> Iterator[Record]:
        with open(self.file, "rb") as handle:
            position, record_lines = [0], []

            def lines() -> Iterator[str]:
                for raw in handle:
                    position[0] += len(raw)
                    record_lines.append(raw.decode("utf-8"))
                    yield record_lines[-1]

            reader = csv.reader(lines(), delimiter=self.separator)
            header = next(reader, None)
            if header is None:
                return
            self.header, self.names = header, set(header)
            width = len(header)
            while True:
                start, line = position[0], reader.line_num + 1
                record_lines.clear()
                fields = next(reader, None)
                if fields is None:
                    return
                if len(record_lines) > 1:
                    self._check_quotes(record_lines, fields, line)
                if not fields:  # a blank line, skipped as csv.DictReader skips it
                    continue
                record = dict(zip(header, fields))
                if len(fields) > width:
                    record[None] = fields[width:]
                for key in header[len(fields):]:
                    record[key] = None
                yield start, line, record

    def _check_quotes(self, lines: list[str], fields: list[str], line: int) -> None:
        """DataError unless the record of `lines` (from line `line`), parsed as `fields`, is well-formed csv."""
        try:
            for _ in csv.reader(lines, delimiter=self.separator, strict=True):
                pass
        except csv.Error as error:
            spanning = next((i for i, field in enumerate(fields) if "\n" in field), len(fields))
            opened = line + sum(field.count("\n") for field in fields[:spanning])
            raise DataError(f"{self.file} line {opened}: a quote opens a field that does not close where a field "
                            f"ends ({error}); it swallows the {len(lines) - 1} lines after it into one field. Close "
                            "the quote, or double a quote meant literally (\"\")") from error


class DelimitedReader:
    """The record that starts at a byte offset, read with the file's header."""

    def __init__(self, file: Path, header: list[str] | None, separator: str) -> None:
        self.handle = open(file, "rb")  # noqa: SIM115 - held for the index's life
        self.header, self.separator = header, separator

    def record(self, offset: int) -> dict:
        self.handle.seek(offset)
        lines = (raw.decode("utf-8") for raw in iter(self.handle.readline, b""))
        return next(csv.DictReader(lines, fieldnames=self.header, delimiter=self.separator))

    def close(self) -> None:
        self.handle.close()


class Delimited(IndexedFormat):
    text_table = True

    def __init__(self, suffix: str, separator: str) -> None:
        self.name, self.suffixes, self.separator = suffix, (suffix,), separator

    def records(self, file: Path, keys: Keys, every_column: bool = False) -> DelimitedRecords:
        return DelimitedRecords(file, self.separator)

    def reader(self, file: Path, header: list[str] | None) -> DelimitedReader:
        return DelimitedReader(file, header, self.separator)

    def write(self, handle: TextIO, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
        writer = csv.writer(handle, delimiter=self.separator)
        writer.writerow(columns)
        writer.writerows(rows)


TSV = Delimited(".tsv", "\t")
CSV = Delimited(".csv", ",")
