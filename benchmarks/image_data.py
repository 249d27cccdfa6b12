"""Generated image data sets in the formats `gradcache train simclr|clip` reads, for the data scaling, data-wait and
torchrun benchmarks: an ImageFolder of JPEGs in 8 classes, a caption table of the same files (open_clip's
`filepath`/`title` CSV) and webdataset shards of the same samples (`KEY.jpg`, `KEY.txt` caption, `KEY.cls` class:
one set of shards serves both modes).

Image i is smooth colour noise (8 x 8 random pixels, resized) at the requested side, JPEG quality 90, and caption
i a few of 200 invented words: deterministic in i, so every format of one size holds the same samples. Each set
is written once into its own folder of `--data-dir` and reused; a marker file says it is complete.
"""
from __future__ import annotations

import csv
import io
import random
import tarfile
from pathlib import Path

CLASSES = 8
WORDS = ["".join(random.Random(index).choices("abcdefghijklmnopqrstuvwxyz", k=3 + index % 6)) for index in range(200)]


def jpeg_bytes(index: int, image_size: int) -> bytes:
    """Image `index`: 8 x 8 random colours resized to `image_size` (bilinear), encoded as JPEG."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(index).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).resize((image_size, image_size), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def caption(index: int) -> str:
    words = random.Random(index).choices(WORDS, k=6)
    return f"a photo of a {' '.join(words)}, class {index % CLASSES}"


def _complete(folder: Path) -> bool:
    return (folder / ".complete").exists()


def image_folder(data_dir: Path, size: int, image_size: int) -> Path:
    """An ImageFolder root of `size` images (`class<k>/<index>.jpg`) and its caption table `captions.csv`
    (columns filepath, title; paths relative to the table); returns the root."""
    root = Path(data_dir) / f"images-{size}-{image_size}px"
    if _complete(root):
        return root
    with open(_mkdir(root) / "captions.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["filepath", "title"])
        for index in range(size):
            relative = Path(f"class{index % CLASSES}") / f"{index:07d}.jpg"
            (root / relative).parent.mkdir(exist_ok=True)
            (root / relative).write_bytes(jpeg_bytes(index, image_size))
            writer.writerow([relative.as_posix(), caption(index)])
    (root / ".complete").touch()
    return root


def caption_table(data_dir: Path, size: int, image_size: int) -> Path:
    """The caption table of `image_folder` (written with it)."""
    return image_folder(data_dir, size, image_size) / "captions.csv"


def shards(data_dir: Path, size: int, image_size: int, shard_size: int = 1000) -> Path:
    """A folder of webdataset shards `part-<n>.tar`, `shard_size` samples each (the last may hold fewer), of the
    same `size` samples; returns the folder."""
    folder = Path(data_dir) / f"shards-{size}-{image_size}px-{shard_size}"
    if _complete(folder):
        return folder
    _mkdir(folder)
    for first in range(0, size, shard_size):
        with tarfile.open(folder / f"part-{first // shard_size:05d}.tar", "w") as tar:
            for index in range(first, min(first + shard_size, size)):
                members = {"jpg": jpeg_bytes(index, image_size), "txt": caption(index).encode(),
                           "cls": str(index % CLASSES).encode()}
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"{index:07d}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (folder / ".complete").touch()
    return folder


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
