"""Real data in the formats people have: scikit-learn's digits, an image folder, a CSV/TSV of paths and captions.

Each loader decodes every image once, at start, to `image_size` x `image_size` RGB uint8 (shorter side resized,
then centre-cropped), and training reads only that copy in memory: a file that breaks after the start (replaced,
truncated, on a disk that went away) cannot fail a run hours in. Skip and count: an image that fails to decode,
and a table row without an image path or with an empty caption, is left out; a warning names them (the first
ten) and `ImageSet.skipped` keeps every name, so the run summary can report the count. A source where nothing
decodes, a missing path, or a CSV without the named columns raises `DataError` before training starts; more
skipped than a run allows (`check_bad_share`, --max-bad-share) raises `TooMuchBadData`.
"""
from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from gradcache.train.config import RunConfig
from gradcache.train.data.images.sets import DataSplits, ImageSet, random_split
from gradcache.train.data.images.shapes import load_shapes
from gradcache.train.errors import DataError, TooMuchBadData

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def check_bad_share(skipped: list[str], kept: int, max_share: float, items: str) -> None:
    """Refuse data of which more than `max_share` of the entries (`kept` loaded, `skipped` left out) are bad."""
    total = kept + len(skipped)
    if total and len(skipped) > max_share * total:
        shown = "; ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        raise TooMuchBadData(f"{len(skipped)} of {total} {items} ({len(skipped) / total:.1%}) could not be used, more "
                             f"than --max-bad-share {max_share:g} allows ({shown}); repair the data, or raise "
                             "--max-bad-share to train on the rest")


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


def decode_image(path: Path, image_size: int) -> torch.Tensor:
    """(3, image_size, image_size) uint8: the shorter side resized to `image_size`, then centre-cropped."""
    with Image.open(path) as opened:
        image = opened.convert("RGB")
    width, height = image.size
    scale = image_size / min(width, height)
    resized = image.resize((max(image_size, round(width * scale)), max(image_size, round(height * scale))),
                           Image.Resampling.BILINEAR)
    left = (resized.width - image_size) // 2
    top = (resized.height - image_size) // 2
    cropped = resized.crop((left, top, left + image_size, top + image_size))
    return torch.frombuffer(bytearray(cropped.tobytes()), dtype=torch.uint8).view(image_size, image_size, 3).permute(
        2, 0, 1
    )


def _decode_all(paths: list[Path], image_size: int) -> tuple[torch.Tensor, list[int], list[str]]:
    """Decode every path; return the stacked images, the indices that decoded, and the names that did not."""
    images, kept, skipped = [], [], []
    for index, path in enumerate(paths):
        try:
            images.append(decode_image(path, image_size))
            kept.append(index)
        except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError):
            skipped.append(str(path))
    if skipped:
        shown = ", ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(f"skipped {len(skipped)} of {len(paths)} images that failed to decode: {shown}", stacklevel=3)
    if not images:
        raise DataError(f"none of the {len(paths)} images decoded (first: {paths[0] if paths else 'none'}); "
                        "check that the files are images")
    return torch.stack(images), kept, skipped


def load_image_folder(root: str | os.PathLike, image_size: int, test_size: int, seed: int) -> DataSplits:
    """torchvision's ImageFolder layout: `root/<class name>/<image>`; class names sorted; a random held-out split."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--data {str(root)!r} is not a directory; give an ImageFolder root "
                        "(one sub-folder of images per class) or 'shapes' / 'digits'")
    class_names = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    paths, labels = [], []
    for label, name in enumerate(class_names):
        for file in sorted((root / name).rglob("*")):
            if file.suffix.lower() in IMAGE_EXTENSIONS:
                paths.append(file)
                labels.append(label)
    if not paths:
        raise DataError(f"--data {str(root)!r} holds no images in class sub-folders "
                        f"(looked for {', '.join(IMAGE_EXTENSIONS)} under root/<class>/)")
    images, kept, skipped = _decode_all(paths, image_size)
    data = ImageSet(images=images, labels=torch.tensor(labels)[kept], class_names=class_names, skipped=skipped)
    return random_split(data, test_size, seed, name=f"folder:{root}")


def load_caption_table(
    table: str | os.PathLike, image_size: int, test_size: int, seed: int,
    image_key: str = "filepath", caption_key: str = "title", separator: str | None = None,
) -> DataSplits:
    """open_clip's CSV/TSV convention: one row per pair, image path (relative to the table's folder) and caption.

    `separator` None: tab for `.tsv`, comma otherwise.
    """
    table = Path(table)
    if not table.is_file():
        raise DataError(f"--data {str(table)!r} is not a file; give a CSV or TSV of image paths and captions")
    if separator is None:
        separator = "\t" if table.suffix.lower() == ".tsv" else ","
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
    paths = [Path(path) if Path(path).is_absolute() else table.parent / path for path, _ in rows]
    images, kept, skipped = _decode_all(paths, image_size)
    data = ImageSet(images=images, captions=[rows[i][1] for i in kept], skipped=bad_rows + skipped)
    return random_split(data, test_size, seed, name=f"captions:{table}")


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
