"""Real data in the formats people have: scikit-learn's digits, an image folder, a CSV/TSV of paths and captions.

Digits are small and decoded into memory. An image folder and a caption table are listed, not decoded: the
training images stay paths (with their labels or captions) in a `LazyImageSet` (lazy.py), each decoded to
`image_size` x `image_size` RGB uint8 (shorter side resized, then centre-cropped) when a batch draws it, in the
data-loader workers; only the held-out split (--test-size images) is decoded at start, for the evaluation.
Skip and count: a table row without an image path or with an empty caption is left out when the table is read,
a held-out image that fails to decode when it is decoded, a training image when it is drawn (lazy.py says how
the batch keeps its size); a warning names them (the first ten) and `skipped` keeps every name, so the run
summary can report the count. A missing path, a folder without images or a CSV without the named columns
raises `DataError` before training starts; more skipped than a run allows (data/bad_data.py: `check_bad_share` at
start, `BadShare` as the run goes, --max-bad-share) raises `TooMuchBadData`.
"""
from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from gradcache.train.config import RunConfig
from gradcache.train.data.images.lazy import LazyImageSet, decode_image, lazy_split
from gradcache.train.data.images.sets import DataSplits, ImageSet, random_split
from gradcache.train.data.images.shapes import load_shapes
from gradcache.train.data.text.formats import table_separator
from gradcache.train.errors import DataError

__all__ = ["BUILT_IN_DATA", "decode_image", "list_caption_table", "list_image_folder",
           "load_caption_table", "load_digits", "load_image_folder"]  # decode_image: read from here by other commands

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def load_digits(image_size: int, test_size: int, seed: int) -> DataSplits:
    """scikit-learn's 1,797 8 x 8 scans of handwritten digits, upsampled to RGB `image_size` images."""
    from sklearn.datasets import (
        load_digits as sklearn_digits,  # ships with the package: no download
    )

    bunch = sklearn_digits()
    pixels = torch.as_tensor(bunch.images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
    pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    labels = torch.as_tensor(bunch.target, dtype=torch.int64)
    captions = [f"a handwritten digit {DIGIT_WORDS[k]}" for k in labels.tolist()]
    prompts = [[f"a handwritten digit {word}"] for word in DIGIT_WORDS]
    data = ImageSet(images=images, labels=labels, captions=captions, class_names=list(DIGIT_WORDS),
                    class_prompts=prompts)
    return random_split(data, test_size, seed, name="digits")


def list_image_folder(root: str | os.PathLike, image_size: int) -> LazyImageSet:
    """torchvision's ImageFolder layout, `root/<class name>/<image>` (class names sorted), as paths and labels;
    an entry with an image's name that is no regular file (a FIFO, socket or device) skipped, counted and named."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--data {str(root)!r} is not a directory; give an ImageFolder root "
                        "(one sub-folder of images per class) or 'shapes' / 'digits'")
    class_names = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    paths, labels, not_files = [], [], []
    for label, name in enumerate(class_names):
        for file in sorted((root / name).rglob("*")):
            if file.suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            if file.is_file():  # follows links: a link to a regular file is one
                paths.append(str(file))
                labels.append(label)
            elif not file.is_dir():  # a FIFO, socket or device: reading it may never end
                not_files.append(f"{file}: not a regular file")
    if not_files:
        shown = "; ".join(not_files[:10]) + (" ..." if len(not_files) > 10 else "")
        warnings.warn(f"skipped {len(not_files)} entries of {root} that are not regular files: {shown}", stacklevel=2)
    if not paths:
        raise DataError(f"--data {str(root)!r} holds no images in class sub-folders "
                        f"(looked for {', '.join(IMAGE_EXTENSIONS)} under root/<class>/)")
    return LazyImageSet(paths=paths, image_size=image_size, labels=torch.tensor(labels), class_names=class_names,
                        skipped=not_files)


def load_image_folder(root: str | os.PathLike, image_size: int, test_size: int, seed: int) -> DataSplits:
    """An ImageFolder (`list_image_folder`): a random held-out split decoded now, the training files when drawn."""
    return lazy_split(list_image_folder(root, image_size), test_size, seed, name=f"folder:{root}")


def list_caption_table(
    table: str | os.PathLike, image_size: int,
    image_key: str = "filepath", caption_key: str = "title", separator: str | None = None,
) -> LazyImageSet:
    """open_clip's CSV/TSV convention: one row per pair, image path (relative to the table's folder) and caption,
    as paths and captions; rows without a path or caption skipped, counted and named.

    `separator` None: tab for `.tsv`, comma otherwise.
    """
    table = Path(table)
    if not table.is_file():
        raise DataError(f"--data {str(table)!r} is not a file; give a CSV or TSV of image paths and captions")
    if separator is None:
        separator = table_separator(table)
    try:
        with open(table, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle, delimiter=separator)
            columns = reader.fieldnames or []
            missing = [key for key in (image_key, caption_key) if key not in columns]
            if missing:
                raise DataError(f"{table} has no column {missing[0]!r} (columns: {columns}); "
                                "name the columns with --csv-image-key and --csv-caption-key, "
                                "or set --csv-separator")
            records = [(f"line {reader.line_num}", row.get(image_key), row.get(caption_key)) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"cannot read {table}: {error}") from error
    if not records:
        raise DataError(f"{table} has a header but no rows")
    rows, bad_rows = _usable_rows(records, image_key, caption_key)
    if bad_rows:
        shown = "; ".join(bad_rows[:10]) + (" ..." if len(bad_rows) > 10 else "")
        warnings.warn(f"skipped {len(bad_rows)} of {len(records)} rows of {table}: {shown}", stacklevel=2)
    if not rows:
        raise DataError(f"{table} has no row with an image path and a caption ({len(records)} rows read)")
    paths = [path if Path(path).is_absolute() else str(table.parent / path) for path, _ in rows]
    return LazyImageSet(paths=paths, image_size=image_size, captions=[caption for _, caption in rows],
                        skipped=bad_rows)


def load_caption_table(
    table: str | os.PathLike, image_size: int, test_size: int, seed: int,
    image_key: str = "filepath", caption_key: str = "title", separator: str | None = None,
) -> DataSplits:
    """A caption table (`list_caption_table`): a random held-out split decoded now, the training files when drawn."""
    pairs = list_caption_table(table, image_size, image_key, caption_key, separator)
    return lazy_split(pairs, test_size, seed, name=f"captions:{table}")


def _usable_rows(records: list[tuple[str, str | None, str | None]], image_key: str,
                 caption_key: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The (path, caption) of every row that has both (a short row has None), and what is wrong with the others."""
    rows, bad = [], []
    for where, path, caption in records:
        if not (path or "").strip():
            bad.append(f"{where}: no {image_key}")
        elif not (caption or "").strip():
            bad.append(f"{where}: {'no' if caption is None else 'empty'} {caption_key}")
        else:
            rows.append((path, caption))
    return rows, bad


# `--data NAME`: the data sets that need no path, by name. Add one: its loader above, one entry here.
BUILT_IN_DATA: dict[str, Callable[[RunConfig], DataSplits]] = {
    "shapes": lambda config: load_shapes(config.train_size, config.test_size, config.image_size, config.data_seed),
    "digits": lambda config: load_digits(config.image_size, config.test_size, config.data_seed),
}
