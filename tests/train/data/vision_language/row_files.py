"""Vision-language rows written as every text format reads them (JSONL, JSONL.gz, CSV, TSV, Parquet, a datasets
folder), and small PNGs to point them at: the tests of gradcache/train/data/vision_language/ build their data here."""
from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
from PIL import Image

from gradcache.train.config import RunConfig


def png(path: Path, width: int = 8, height: int = 8, seed: int = 0) -> Path:
    """A random RGB PNG at `path` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` (flat: each value a string or None) in the format `path`'s suffix names, or as a datasets folder
    when `path` has none."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name.lower()
    if name.endswith(".jsonl.gz"):
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif name.endswith((".csv", ".tsv")):
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter="\t" if name.endswith(".tsv") else ",")
            writer.writerow(columns)
            writer.writerows([["" if row.get(key) is None else row[key] for key in columns] for row in rows])
    elif name.endswith(".parquet"):
        import pyarrow
        from pyarrow import parquet

        parquet.write_table(pyarrow.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]), path)
    else:
        import datasets

        datasets.Dataset.from_list([{key: row.get(key) for key in columns} for row in rows]).save_to_disk(str(path))
    return path


def vlm_config(data: Path | str, **options) -> RunConfig:
    """The run options of `gradcache train vlm` on `data` (read in this process: --workers 0 unless given)."""
    return RunConfig(**{"mode": "vlm", "data": str(data), "workers": 0, **options})


def side_of(side) -> tuple:
    """A RowSide as (text, image values, root): what two formats must read alike."""
    return side.text, side.images, side.root


def row_of(row) -> tuple:
    """A VisionLanguageRow without its `where` (a line in one format, a row in another)."""
    return side_of(row.query), side_of(row.positive), tuple(side_of(side) for side in row.negatives)
