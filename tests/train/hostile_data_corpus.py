"""Hostile data, environment and --deepspeed values of issue 49 (items 3 and 6), beside tests/train/hostile_corpus.py
and in its format, with a time bound: each `DataCase` builds its bad input into a folder and returns the command
that meets it, under the environment `env` gives, and names the status (by its name in docs/outputs.md's table),
the seconds the command may take, and the fragments its message must hold (the one error line of a refusal, or
the warnings of a run that skips the input and ends OK).

Images: a 175 KB 16-bit greyscale PNG of 1 x 60,000,000 pixels among 48 images (its decode would take 572 MiB:
refused from its header, skipped and counted); a FIFO named zz.png in an image folder (a read of it never ends);
a PNG that PIL opens and then rejects with SyntaxError, in the held-out set and in SimCLR's kNN reference set.
Environment: LOCAL_RANK abc, empty or -1, WORLD_SIZE 0, RANK abc or past WORLD_SIZE. DeepSpeed: a bucket of 10**15
elements (as an integer and as 1e15) and a config nested 100,000 levels deep.
"""
from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from tests.train.conftest import TINY


@dataclass(frozen=True)
class DataCase:
    """A bad input, the environment it runs under, the status name it must end with within `seconds`, and what
    its message (or, for OK, its warnings) must say."""

    name: str
    build: Callable[[Path], list[str]]
    status: str
    seconds: float
    fragments: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    slow: bool = False  # a case that trains to the end


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: its length, its kind, its data and their CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def sixteen_bit_thin_png(height: int) -> bytes:
    """A 16-bit greyscale PNG of 1 x `height` zeros, compressed block by block (no pixel array is ever built):
    175 KB for 60,000,000 rows."""
    compressor = zlib.compressobj(9)
    block = b"\x00" * (3 * 2**20)  # 2**20 rows of a filter byte and one 2-byte sample
    full, rest = divmod(height, 2**20)
    pixels = b"".join(compressor.compress(block) for _ in range(full)) + compressor.compress(block[:3 * rest])
    header = struct.pack(">IIBBBBB", 1, height, 16, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", pixels + compressor.flush())
            + png_chunk(b"IEND", b""))


def syntax_error_png() -> bytes:
    """A valid 12 x 12 PNG followed by a zTXt chunk of an unknown compression method: PIL opens it and raises
    SyntaxError when its pixels are loaded."""
    image = io.BytesIO()
    Image.new("RGB", (12, 12), (200, 10, 10)).save(image, "PNG")
    data = image.getvalue()
    end = data.rfind(b"IEND") - 4
    return data[:end] + png_chunk(b"zTXt", b"k\x00\x01xx") + data[end:]


def image_folder(root: Path, per_class: int = 24) -> Path:
    """An ImageFolder of two classes of `per_class` small PNGs each."""
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            Image.new("RGB", (12, 10), (label * 120 + index * 4, 200, 30)).save(root / name / f"{index:03d}.png")
    return root


def _simclr_folder(folder: Path, data: Path, *extra: str) -> list[str]:
    options = list(TINY["simclr"])
    del options[options.index("--train-size"):options.index("--train-size") + 4]  # the folder sets both sizes
    return ["train", "simclr", *options, "--data", str(data), "--test-size", "8", "--output-dir",
            str(folder / "run"), *extra]


def _shapes(folder: Path, *extra: str) -> list[str]:
    return ["train", "simclr", *TINY["simclr"], "--output-dir", str(folder / "run"), *extra]


# --- images --------------------------------------------------------------------------------------------------
def png_bomb_among_48(folder: Path) -> list[str]:
    data = image_folder(folder / "data")
    (data / "dog" / "bomb.png").write_bytes(sixteen_bit_thin_png(60_000_000))
    return _simclr_folder(folder, data, "--workers", "2")


def fifo_named_zz_png(folder: Path) -> list[str]:
    data = image_folder(folder / "data")
    os.mkfifo(data / "dog" / "zz.png")
    return _simclr_folder(folder, data, "--workers", "2")


def syntax_error_held_out(folder: Path) -> list[str]:
    held_out = image_folder(folder / "held-out", per_class=6)
    (held_out / "cat" / "broken.png").write_bytes(syntax_error_png())
    return _simclr_folder(folder, image_folder(folder / "data"), "--eval-data", str(held_out))


def syntax_error_knn_reference(folder: Path) -> list[str]:
    data = image_folder(folder / "data")
    for index in range(8):  # every file is trained on, and the reference holds them all
        (data / "dog" / f"broken-{index}.png").write_bytes(syntax_error_png())
    return _simclr_folder(folder, data, "--eval-reference-size", "1000", "--max-bad-share", "0.2")


# --- torchrun's variables --------------------------------------------------------------------------------------
def plain_run(folder: Path) -> list[str]:
    return _shapes(folder)


# --- --deepspeed -----------------------------------------------------------------------------------------------
def _deepspeed(folder: Path, text: str) -> list[str]:
    (folder / "ds.json").write_text(text)
    return _shapes(folder, "--deepspeed", str(folder / "ds.json"))


def bucket_of_1e15(folder: Path) -> list[str]:
    return _deepspeed(folder, json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 10**15}}))


def bucket_of_1e15_float(folder: Path) -> list[str]:
    return _deepspeed(folder, '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e15}}')


def nested_100_000_levels(folder: Path) -> list[str]:
    return _deepspeed(folder, '{"zero_optimization": {"stage": 2, "overlap_comm": ' + "[" * 100_000 + "]" * 100_000
                      + "}}")


DATA_CASES = [
    DataCase("png-16-bit-bomb-among-48", png_bomb_among_48, "OK", 120, ("bomb.png",), slow=True),
    DataCase("fifo-named-zz-png", fifo_named_zz_png, "OK", 60, ("zz.png", "not regular files"), slow=True),
    DataCase("syntax-error-held-out", syntax_error_held_out, "OK", 60, ("broken.png", "held-out"), slow=True),
    DataCase("syntax-error-knn-reference", syntax_error_knn_reference, "OK", 60, ("broken-", "kNN reference"),
             slow=True),
    DataCase("local-rank-abc", plain_run, "USAGE", 10, ("LOCAL_RANK='abc'",), env={"LOCAL_RANK": "abc"}),
    DataCase("local-rank-empty", plain_run, "USAGE", 10, ("LOCAL_RANK=''",), env={"LOCAL_RANK": ""}),
    DataCase("local-rank-negative", plain_run, "USAGE", 10, ("LOCAL_RANK='-1'",), env={"LOCAL_RANK": "-1"}),
    DataCase("world-size-zero", plain_run, "USAGE", 10, ("WORLD_SIZE='0'",), env={"WORLD_SIZE": "0"}),
    DataCase("rank-abc", plain_run, "USAGE", 10, ("RANK='abc'",), env={"RANK": "abc"}),
    DataCase("rank-past-world-size", plain_run, "USAGE", 10, ("RANK=2", "WORLD_SIZE=2"),
             env={"RANK": "2", "WORLD_SIZE": "2"}),
    DataCase("deepspeed-bucket-1e15", bucket_of_1e15, "USAGE", 30, ("ds.json", "reduce_bucket_size", "at most")),
    DataCase("deepspeed-bucket-1e15-float", bucket_of_1e15_float, "USAGE", 30, ("ds.json", "reduce_bucket_size")),
    DataCase("deepspeed-nested-100000", nested_100_000_levels, "USAGE", 30,
             ("ds.json", "zero_optimization.overlap_comm", "deeper than 8")),
]
