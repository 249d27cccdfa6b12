"""`.parquet`: compressed by row group, so reading one row decodes the columns of its row group; each process
keeps the last row group it decoded (one per file). Small row groups (a few thousand rows, `row_group_size` of
pyarrow's writer) keep a shuffled epoch's reads cheap. A file is read without pre-buffering and on one thread:
pyarrow's default reads ahead whole column chunks, which held +700 MB of anonymous memory at the peak of
indexing 1M rows (570 MB of Parquet) against +120 MB without."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gradcache.train.data.text.formats.columnar import COLUMNAR_BATCH, ColumnarRecords
from gradcache.train.data.text.formats.text_format import IndexedFormat, Keys
from gradcache.train.errors import DataError


class ParquetReader:
    """Row `number` of one Parquet file, as a dict of its columns, a row group decoded at a time."""

    def __init__(self, file: Path, columns: list[str]) -> None:
        from pyarrow import parquet

        self.columns = columns
        self.file = parquet.ParquetFile(file, pre_buffer=False)
        rows = [self.file.metadata.row_group(group).num_rows for group in range(self.file.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.group, self.group_number = None, -1

    def record(self, number: int) -> dict:
        group = int(np.searchsorted(self.group_starts, number, side="right")) - 1
        if group != self.group_number:
            self.group = self.file.read_row_group(group, columns=self.columns, use_threads=False)
            self.group_number = group
        return self.group.slice(number - int(self.group_starts[group]), 1).to_pylist()[0]

    def close(self) -> None:
        self.file.close()


class Parquet(IndexedFormat):
    name = ".parquet"
    suffixes = (".parquet",)
    unit = "row"

    def records(self, file: Path, keys: Keys, every_column: bool = False) -> ColumnarRecords:
        from pyarrow import parquet

        try:
            names = list(parquet.ParquetFile(file).schema_arrow.names)
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"cannot read {file}: {error}") from error

        def batches(columns: list[str]):
            try:
                return parquet.ParquetFile(file, pre_buffer=False).iter_batches(
                    batch_size=COLUMNAR_BATCH, columns=columns, use_threads=False)
            except (OSError, ValueError) as error:
                raise DataError(f"cannot read {file}: {error}") from error

        return ColumnarRecords(names, keys, batches, every_column)

    def reader(self, file: Path, header: list[str] | None) -> ParquetReader:
        return ParquetReader(file, header)


PARQUET = Parquet()
