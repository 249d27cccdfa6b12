"""What `gradcache encode`, `eval` and `mine` read, with the training program's readers (one copy of each format).

- texts to embed: a `.txt` file, one text per line (every line a row, in order), or one column (`--key`) of a
  `.tsv`, `.csv` or `.jsonl` table (gradcache/train/data/text/formats/'s `table_records`);
- images to embed: a folder (every image file under it, sorted by path) or one column (`--image-key`) of a table
  of image paths (relative paths are relative to the table's folder), decoded as training decodes them
  (gradcache/train/data/images/files.py: shorter side resized, centre crop); or webdataset shards (a `.tar`, a
  folder of them, a glob or brace pattern: gradcache/train/data/images/shards.py's reader), their samples in
  shard order (the shard paths sorted) then member order (the order of the samples in each tar);
- a corpus (`--corpus`): a `.tsv`, `.csv` or `.jsonl` table of `id` and `text` rows, ids distinct;
- a vision-language model's inputs: a table's rows, each one input of its text (`--key`), its images (`--image-key`:
  a path under the table's folder, a list of them, or `{"bytes", "path"}`, opened as training opens them,
  gradcache/train/data/images/row_images.py) or both; a `.txt` file's lines (texts) or a folder's images.
Rows keep their order and are never skipped (row i of the output is row i of the input): an empty file, a
missing column, an empty corpus text, an image that does not decode or an input row with neither text nor an image
raises DataError (exit status 2). Shards
are the exception, as in training: a member that does not decode (or a truncated shard's tail) is skipped and
counted, and `read_shard_images` names it, so that the caller can say so; the rows are then the samples that
decode, still in shard and member order.
"""
from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradcache.models.vision_language_collator import VisionLanguageInput
from gradcache.train.data.images.files import IMAGE_EXTENSIONS, decode_image
from gradcache.train.data.images.lazy import DECODE_ERRORS
from gradcache.train.data.images.row_images import BadRowImage, row_images
from gradcache.train.data.images.shards import decode_head, find_shards, is_shard_spec
from gradcache.train.data.text.formats import is_text_lines, table_records
from gradcache.train.errors import DataError

CORPUS_ID, CORPUS_TEXT = "id", "text"  # the corpus table's column (field) names


def _existing(path: str | os.PathLike, option: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise DataError(f"{option} {str(path)!r} does not exist")
    return path


def _column(path: Path, key: str, option: str, key_option: str) -> list[str]:
    rows, names = table_records(path, option)
    if key not in names:
        raise DataError(f"{path} has no column {key!r} (columns: {sorted(names)}); name it with {key_option}")
    return [_text(record.get(key), f"{option} {path} {where}", key) for where, record in rows]


def _text(value: object, where: str, key: str) -> str:
    """A table's field as text, stripped (null: empty); a value of another type (a JSON number, list, object) is
    refused naming the row and column, never embedded as its Python spelling, as training refuses it."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: column {key!r} holds {type(value).__name__}, not text; make it a string (or "
                        "null), or name another column")
    return value.strip()


def read_texts(path: str | os.PathLike, key: str | None) -> list[str]:
    """Every text of `path` in order: its lines (`.txt`) or its column `key` (a table).

    Raises:
        DataError: no such file, a table without column `key` (or no `key` for a table), or no text at all.
    """
    path = _existing(path, "--data")
    if is_text_lines(path):
        try:
            texts = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"cannot read --data {path}: {error}") from error
    else:
        if key is None:
            raise DataError(f"--data {path} is a table: name the column of texts to embed with --key (or give a "
                            ".txt file, one text per line)")
        texts = _column(path, key, "--data", "--key")
    if not any(text.strip() for text in texts):
        raise DataError(f"--data {path} holds no text to embed ({len(texts)} rows, all empty)")
    return texts


def read_image_paths(path: str | os.PathLike, image_key: str | None) -> list[Path]:
    """The images to embed, in order: every image file under folder `path` (sorted), or column `image_key` of a
    table of paths (relative to the table's folder).

    Raises:
        DataError: no such path, no image in the folder, a table without the column, or a row without a path.
    """
    path = _existing(path, "--data")
    if path.is_dir():
        paths = sorted(file for file in path.rglob("*") if file.suffix.lower() in IMAGE_EXTENSIONS)
        if not paths:
            raise DataError(f"--data {path} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
        return paths
    values = _column(path, image_key, "--data", "--image-key")
    empty = [number for number, value in enumerate(values, start=1) if not value]
    if empty:
        raise DataError(f"--data {path}: row {empty[0]} has no image path in column {image_key!r} "
                        f"({len(empty)} such rows); every row is embedded, so fill them in or remove them")
    if not values:
        raise DataError(f"--data {path} has no rows")
    return [Path(value) if Path(value).is_absolute() else path.parent / value for value in values]


def decode_images(paths: Sequence[Path], image_size: int) -> torch.Tensor:
    """(N, 3, S, S) uint8 images, decoded as training decodes them.

    Raises:
        DataError: an image that does not decode (named): rows are never skipped, so the output stays aligned.
    """
    images = []
    for path in paths:
        try:
            images.append(decode_image(path, image_size))
        except DECODE_ERRORS as error:
            raise DataError(f"image {path} does not decode ({error}); every row is embedded in order, so repair "
                            "or remove it") from error
    return torch.stack(images)


def holds_shards(data: str | os.PathLike) -> bool:
    """Whether `--data` names webdataset shards (a `.tar`, a folder of `.tar` files only, a glob or brace pattern),
    by training's own test (shards.py's `is_shard_spec`)."""
    return is_shard_spec(str(data))


@dataclass
class ShardImages:
    """The samples of shards that decode: `images` (N, 3, S, S) uint8 in shard then member order; `skipped` names
    each member that did not decode and each truncated shard (`shard:key (error)`), in the order met."""

    images: torch.Tensor
    skipped: list[str]


def read_shard_images(spec: str | os.PathLike, image_size: int) -> ShardImages:
    """Every sample of the shards `spec` names, decoded as training decodes them, in shard order (the paths
    sorted, as `find_shards` lists them) then member order; a member that does not decode is skipped and named.

    Raises:
        DataError: no shard matches `spec`, or no sample of them decodes.
    """
    shards = find_shards(str(spec))
    skipped: list[str] = []
    with warnings.catch_warnings():  # the caller reports the skipped members itself (one message, with the count)
        warnings.simplefilter("ignore")
        data = decode_head(shards, sys.maxsize, image_size, False, "--data", skipped)
    return ShardImages(images=data.images, skipped=skipped)


@dataclass
class Corpus:
    """C passages to rank: `texts[i]` has the id `ids[i]`."""

    ids: list[str]
    texts: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    def indices_of(self, passages: Sequence[str], option: str = "--positive-key") -> np.ndarray:
        """(N,) the corpus index of each passage, found by its text, else by its id.

        Raises:
            DataError: a passage that is neither a corpus text nor a corpus id (the first one is named).
        """
        by_text = {text: index for index, text in reversed(list(enumerate(self.texts)))}
        by_id = {identifier: index for index, identifier in enumerate(self.ids)}
        found = [by_text.get(passage, by_id.get(passage, -1)) for passage in passages]
        missing = [number for number, index in enumerate(found) if index < 0]
        if missing:
            raise DataError(f"{len(missing)} rows' positives ({option}) are neither a text nor an id of the corpus, "
                            f"e.g. row {missing[0] + 1}: {passages[missing[0]][:80]!r}; every row's positive must "
                            "be in the corpus")
        return np.array(found, dtype=np.int64)


def read_corpus(path: str | os.PathLike) -> Corpus:
    """The `id`/`text` rows of a `.tsv`, `.csv` or `.jsonl` table.

    Raises:
        DataError: no such file, a missing column, an empty text or id, a repeated id, or no row.
    """
    path = _existing(path, "--corpus")
    rows, names = table_records(path, "--corpus")
    for key in (CORPUS_ID, CORPUS_TEXT):
        if key not in names:
            raise DataError(f"--corpus {path} has no column {key!r} (columns: {sorted(names)}); a corpus holds "
                            f"'{CORPUS_ID}' and '{CORPUS_TEXT}' columns")
    ids, texts = [], []
    for where, record in rows:
        identifier = record.get(CORPUS_ID)  # an integer id (MS MARCO's) is spelled as written
        identifier = str(identifier) if type(identifier) is int else _text(identifier, f"--corpus {path} {where}",
                                                                            CORPUS_ID)
        text = _text(record.get(CORPUS_TEXT), f"--corpus {path} {where}", CORPUS_TEXT)
        if not identifier or not text:
            raise DataError(f"--corpus {path} {where}: empty {'id' if not identifier else 'text'}")
        ids.append(identifier)
        texts.append(text)
    if not texts:
        raise DataError(f"--corpus {path} has no rows")
    repeated = len(ids) - len(set(ids))
    if repeated:
        first = next(identifier for identifier in ids if ids.count(identifier) > 1)
        raise DataError(f"--corpus {path}: {repeated} repeated ids (e.g. {first!r}); ids must be distinct")
    return Corpus(ids=ids, texts=texts)


@dataclass(frozen=True)
class InputRow:
    """One input of a vision-language model: `where` it is in --data (for messages), its `text` ("" for none),
    its image value as the row holds it (None, a path, a list of them, or `{"bytes", "path"}`), and the folder
    its paths resolve under (`root`)."""

    where: str
    text: str
    images: Any
    root: Path

    def opened(self) -> VisionLanguageInput:
        """The input with its images opened (8-bit RGB, as training opens them).

        Raises:
            DataError: an image that cannot be used (a path outside `root`, a decompression bomb, an extreme
                aspect ratio, a file that does not decode), naming the row and why.
        """
        try:
            images = row_images(self.images, self.root)
        except BadRowImage as error:
            raise DataError(f"--data {self.where}: {error}; every row is embedded in order, so repair or remove "
                            "it") from error
        return VisionLanguageInput(text=self.text or None, images=tuple(images))


def read_input_rows(path: str | os.PathLike, key: str | None, image_key: str | None) -> list[InputRow]:
    """A vision-language model's inputs in `path`, in order: each table row's text (column `key`) and image value
    (column `image_key`), either column or both; each line of a `.txt` file (a text); each image under a folder
    (sorted by path).

    Raises:
        DataError: no such path; a table without a column named, or with neither named; a text that is not a
            string; a row with neither text nor an image (named); no row.
    """
    path = _existing(path, "--data")
    if path.is_dir():
        return [InputRow(f"{path} image {file.relative_to(path)}", "", file.name, file.parent)
                for file in read_image_paths(path, None)]
    if is_text_lines(path):
        texts = read_texts(path, None)
        empty = next((number for number, text in enumerate(texts, start=1) if not text.strip()), None)
        if empty is not None:
            raise DataError(f"--data {path} line {empty} is empty; every line is embedded as one text, so fill it "
                            "in or remove it")
        return [InputRow(f"{path} line {number}", text, None, path.parent)
                for number, text in enumerate(texts, start=1)]
    if key is None and image_key is None:
        raise DataError(f"--data {path} is a table: name its texts' column with --key, its images' with "
                        "--image-key, or both (each row is then one input of its text and its images)")
    records, names = table_records(path, "--data")
    for column, option in ((key, "--key"), (image_key, "--image-key")):
        if column is not None and column not in names:
            raise DataError(f"{path} has no column {column!r} (columns: {sorted(names)}); name it with {option}")
    rows = []
    for where, record in records:
        place = f"{path} {where}"
        text = "" if key is None else _text(record.get(key), f"--data {place}", key)
        images = None if image_key is None else record.get(image_key)
        if not text and images in (None, "", [], ()):
            named = " and ".join(f"{option} {column!r}" for column, option in ((key, "--key"),
                                 (image_key, "--image-key")) if column is not None)
            raise DataError(f"--data {place} has neither text nor an image ({named}); every row is embedded as "
                            "one input, so fill it in or remove the row")
        rows.append(InputRow(place, text, images, path.parent))
    if not rows:
        raise DataError(f"--data {path} has no rows")
    return rows
