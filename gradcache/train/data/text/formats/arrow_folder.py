"""A Hugging Face `datasets` folder (`Dataset.save_to_disk`: state.json, dataset_info.json, *.arrow), opened with
`datasets.load_from_disk`, which memory-maps its Arrow files: no copy is made, and a row is read (`dataset[i]`)
when it is asked for."""
from __future__ import annotations

from pathlib import Path

from gradcache.train.data.text.formats.columnar import COLUMNAR_BATCH, ColumnarRecords
from gradcache.train.data.text.formats.text_format import IndexedFormat, Keys
from gradcache.train.errors import DataError


def load_folder(path: Path):
    """The one `datasets.Dataset` in `path` (DataError without the datasets package, or for a DatasetDict)."""
    try:
        import datasets
    except ImportError as error:
        raise DataError(f"--data {str(path)!r} is a Hugging Face datasets folder, which needs the datasets package: "
                        "pip install 'gradcache[text]'") from error
    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read the datasets folder {path}: {error}") from error
    if not isinstance(dataset, datasets.Dataset):
        raise DataError(f"{path} holds a DatasetDict ({', '.join(dataset)}); give the folder of one split, e.g. "
                        f"{path / next(iter(dataset))}")
    return dataset


class ArrowFolderReader:
    """Row `number` of one datasets folder, as a dict of its columns read from its Arrow table, as `records` reads
    them: undecoded (an `Image` column's `{"bytes", "path"}`, never a PIL image datasets would decode unchecked)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.table = load_folder(path).select_columns(columns).data  # memory-mapped

    def record(self, number: int) -> dict:
        return self.table.slice(number, 1).to_pylist()[0]

    def close(self) -> None:
        pass


class ArrowFolder(IndexedFormat):
    name = "datasets"
    folder = "a datasets folder"
    unit = "row"

    def is_folder(self, path: Path) -> bool:
        return path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()

    def records(self, file: Path, keys: Keys, every_column: bool = False) -> ColumnarRecords:
        dataset = load_folder(file)
        return ColumnarRecords(list(dataset.column_names), keys, lambda columns: dataset.select_columns(
            columns).data.to_batches(max_chunksize=COLUMNAR_BATCH), every_column)

    def reader(self, file: Path, header: list[str] | None) -> ArrowFolderReader:
        return ArrowFolderReader(file, header)


ARROW_FOLDER = ArrowFolder()
