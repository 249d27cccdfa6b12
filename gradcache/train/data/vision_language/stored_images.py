"""Image bytes that stay in their data file until a batch opens them. A Parquet file or a datasets folder holds its
images as datasets' `{"bytes", "path"}`; read into the rows whole, a few hundred thousand document pages would hold
gigabytes of memory. A row holds a `StoredImage` in their place instead: where the bytes lie (the file, its row,
the column and the item's place in the column's value), the name datasets kept, and a digest of the bytes (so two
rows holding the same image are one held-out candidate, as equal bytes were). Opening one reads its row's column
again through the format's reader (Parquet: a row group decoded at a time, the last one kept), one reader per file
and column in each process, opened at its first use there (a DataLoader worker opens its own)."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradcache.train.data.text.formats import format_named
from gradcache.train.data.text.formats.text_format import RecordReader

# (process, file, column) -> its reader: a forked worker never reads through its parent's open file
_READERS: dict[tuple[int, str, str], RecordReader] = {}


@dataclass(frozen=True)
class StoredImage:
    """An image's bytes at item `at` (list indices; () for the value itself) of column `column` of row `row` of
    `file` (a file of format `format_name`, as data/text/formats/ names it); `path` is the name datasets kept for it
    (None where it kept none), `digest` a BLAKE2b digest of its bytes."""

    file: str
    format_name: str
    row: int
    column: str
    at: tuple[int, ...]
    path: str | None
    digest: bytes

    def value(self) -> dict[str, Any]:
        """datasets' `{"bytes", "path"}` of the image, read from the file."""
        key = (os.getpid(), self.file, self.column)
        if key not in _READERS:
            _READERS[key] = format_named(self.format_name).reader(Path(self.file), [self.column])
        value = _READERS[key].record(self.row)[self.column]
        for index in self.at:
            value = value[index]
        return {"bytes": value["bytes"], "path": value.get("path")}


def with_stored_images(record: dict[str, Any], file: Path, format_name: str, row: int) -> dict[str, Any]:
    """`record` (row `row` of `file`) with each `{"bytes", "path"}` that holds bytes, at any depth of lists,
    replaced by its `StoredImage`; every other value as it was."""

    def stored(value: Any, column: str, at: tuple[int, ...]) -> Any:
        if isinstance(value, Mapping) and isinstance(value.get("bytes"), (bytes, bytearray)) \
                and isinstance(value.get("path"), (str, type(None))):  # else record_rows.py refuses it
            return StoredImage(str(file), format_name, row, column, at, value.get("path"),
                               hashlib.blake2b(value["bytes"], digest_size=16).digest())
        if isinstance(value, list):
            return [stored(item, column, (*at, index)) for index, item in enumerate(value)]
        return value

    return {column: stored(value, column, ()) for column, value in record.items()}
