"""What the columnar formats (parquet.py, arrow_folder.py) share: a record's offset is its row number in its file
(a folder: its dataset), so the index is the same int64 array as for text files, 8 bytes a kept row.

The indexing pass reads record batches of the named columns only (`COLUMNAR_BATCH` rows at a time).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from gradcache.train.data.text.formats.text_format import Keys, Record

COLUMNAR_BATCH = 256  # rows: of page images (about 500 KB each) a batch holds about 128 MB, not 2 GB at 4,096


class ColumnarRecords:
    """(row number, row number + 1, record) of every row of a columnar file, a record batch at a time, of the
    columns of `keys` that it has, or of all of them with `every_column` (`header`); `names` are all of its
    columns (read from its schema, no row)."""

    def __init__(self, names: list[str], keys: Keys, batches: Callable[[list[str]], Iterable],
                 every_column: bool = False) -> None:
        self.names = set(names)
        self.header = list(names) if every_column else [key for key in (keys[0], keys[1], *keys[2])
                                                         if key in self.names]
        self.batches = batches

    def __iter__(self) -> Iterator[Record]:
        number = 0
        for batch in self.batches(self.header):
            for record in batch.to_pylist():
                yield number, number + 1, record
                number += 1
