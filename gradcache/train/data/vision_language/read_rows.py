"""Every row of the files --data (or --eval-data) names, read into memory through the text formats' registry
(data/text/formats/: JSONL, streamed JSONL.gz, CSV, TSV, Parquet, a datasets folder; data/text/files.py: a file,
a folder, a glob or brace pattern of shards). A row holds texts and image *values*, not pixels, so a million rows
take a few hundred MB; image bytes in a Parquet file or a datasets folder stay there, a row holding where they lie
(stored_images.py).

- The fields read are those the keys name (row_keys.py), a record's other fields dropped as it is read.
- A row that cannot train (record_rows.py: a wrong type, a side with neither text nor image, placeholders that do
  not match, fewer than h hard negatives) is skipped and counted (data/bad_data.py's `SkippedRows`, named in one
  warning); a JSONL.gz line that is not a JSON object, or a file that cannot be read to its end, too. A plain file
  that cannot be parsed (a .jsonl line that is not JSON, a broken quote) is refused naming the line, as the text
  mode refuses it.
- h is --negatives-per-query, or the count most of the first FIRST_ROWS usable rows have (usable_rows.py's rule).
- Image paths resolve under --image-root when given, else under the folder of the data's first file; the rows of
  a file in another folder carry their own (`RowSide.root`).
"""
from __future__ import annotations

import csv
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gradcache.train.config import RunConfig
from gradcache.train.data.bad_data import SkippedRows
from gradcache.train.data.streams import Damaged
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.formats import TextFormat, format_named
from gradcache.train.data.text.formats.jsonl import json_value
from gradcache.train.data.text.usable_rows import FIRST_ROWS
from gradcache.train.data.vision_language.record_rows import Unusable, record_row, with_negatives
from gradcache.train.data.vision_language.row_keys import NEGATIVE_IMAGES, check_row_columns, row_keys
from gradcache.train.data.vision_language.rows import VisionLanguageRow
from gradcache.train.data.vision_language.stored_images import with_stored_images
from gradcache.train.errors import DataError


@dataclass
class ReadRows:
    """The usable rows of some files, those left out, and h."""

    rows: list[VisionLanguageRow]
    skipped: SkippedRows
    negatives_per_query: int


def read_rows(config: RunConfig, data: str, option: str, image_root: Path | None) -> ReadRows:
    """The rows of `data` (`option`: --data or --eval-data) under `config`'s keys and h (module docstring); a
    side's `root` is its file's folder where that is not `image_root` (None: --image-root, every side's).

    Raises:
        DataError: files that cannot be found or read, a key given that names no field, or no usable row.
        UsageError: --negatives-per-query above 0 with no negatives' keys.
    """
    files, format_name = data_files(data, option)
    text_format = format_named(format_name)
    wanted = row_keys(config, {NEGATIVE_IMAGES}).columns()  # read the default negatives' images where present
    fields = {wanted[0], wanted[1], *wanted[2]}
    names: set = set()
    skipped = SkippedRows()
    records: list[tuple[str, dict, Path | None]] = []
    for file in files:
        root = None if config.image_root is not None or file.parent.resolve() == image_root else file.parent.resolve()
        for where, record in _file_records(text_format, file, wanted, names, skipped):
            records.append((where, {key: record[key] for key in fields if key in record}, root))
    where_name = data if len(files) == 1 else f"{len(files)} files ({files[0]} ...)"
    keys = row_keys(config, names)
    check_row_columns(names, keys, where_name)
    rows: list[VisionLanguageRow] = []
    for where, record, root in records:
        try:
            rows.append(record_row(record, keys, where, root))
        except Unusable as reason:
            skipped.add(f"{where}: {reason}")
    h = config.negatives_per_query
    if h is None:
        counts = Counter(len(row.negatives) for row in rows[:FIRST_ROWS])
        h = counts.most_common(1)[0][0] if counts else 0
    kept = []
    for row in rows:
        try:
            kept.append(with_negatives(row, h))
        except Unusable as reason:
            skipped.add(f"{row.where}: {reason}")
    if skipped:
        warnings.warn(skipped.summary(len(kept) + len(skipped), where_name), stacklevel=2)
    if not kept:
        first = f"; the first left out: {skipped[0]}" if skipped.reasons else ""
        raise DataError(f"{option} {where_name} has no row with a query, a positive (each a text, an image or both) "
                        f"and {h} hard negatives ({len(records)} records read){first}; check the files and the key "
                        "options")
    return ReadRows(kept, skipped, h)


def _file_records(text_format: TextFormat, file: Path, wanted: tuple, names: set,
                  skipped: SkippedRows) -> Iterator[tuple[str, dict]]:
    """(where, record) of each record of `file`; the fields met added to `names`; a streamed line that is no JSON
    object, or a streamed file's damage, skipped and counted.

    Raises:
        DataError: an indexed file that cannot be read or parsed.
    """
    if text_format.streamed:
        for unit in text_format.lines(str(file)):
            if isinstance(unit, Damaged):
                skipped.add(unit.name)
                continue
            _, line, raw = unit
            try:
                record = json_value(raw)
            except ValueError as error:
                skipped.add(f"{file.name} line {line}: not JSON ({error})")
                continue
            if not isinstance(record, dict):
                skipped.add(f"{file.name} line {line}: not a JSON object")
                continue
            names.update(record)
            yield f"{file.name} line {line}", record
        return
    records = text_format.records(file, wanted)
    try:
        for row, line, record in records:  # image bytes stay in the file (stored_images.py)
            yield f"{file.name} {text_format.unit} {line}", with_stored_images(record, file, text_format.name, row)
    except DataError:
        raise
    except (OSError, ValueError, csv.Error) as error:  # UTF-8, csv and pyarrow's errors
        raise DataError(f"cannot read {file}: {error}") from error
    names.update(records.names)
