"""A row's image value for a vision-language model (data/images/row_images.py): paths under the root, lists,
datasets' {bytes, path}; the hostile ones refused by name before they are decoded (a bomb, a 1 x 2,000,000
strip, a path out of the root) or as they fail (truncated, not an image); 16-bit scaled, not clipped."""
from __future__ import annotations

import io
import os
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from gradcache.train.data.images.row_images import BadRowImage, row_images


def _png(path, width: int, height: int, seed: int = 0, mode: str = "RGB"):
    generator = np.random.default_rng(seed)
    if mode == "RGB":
        Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    else:
        Image.fromarray(generator.integers(0, 65536, (height, width), dtype=np.uint16)).save(path)
    return path


def _claimed(width: int, height: int) -> bytes:
    """A 2 x 2 PNG whose header claims `width` x `height` pixels: what a bomb's header says, built in microseconds
    (the refusal reads the header alone, as it must for a real bomb of a few KB)."""
    buffer = io.BytesIO()
    Image.new("L", (2, 2)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    header = b"IHDR" + struct.pack(">II", width, height) + bytes(data[24:29])  # width, height, then depth..interlace
    data[12:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(header))
    return bytes(data)


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image)


def test_paths_lists_and_bytes_open_as_the_same_rgb_images(tmp_path):
    (tmp_path / "pictures").mkdir()
    first, second = _png(tmp_path / "pictures" / "a.png", 30, 20), _png(tmp_path / "b.png", 7, 9, seed=1)
    want = [np.asarray(Image.open(first).convert("RGB")), np.asarray(Image.open(second).convert("RGB"))]
    assert row_images(None, tmp_path) == [] and row_images([], tmp_path) == []
    one = row_images("pictures/a.png", tmp_path)
    assert len(one) == 1 and one[0].mode == "RGB" and np.array_equal(_pixels(one[0]), want[0])
    both = row_images(["pictures/a.png", "b.png"], tmp_path)
    assert [_pixels(image).shape for image in both] == [w.shape for w in want]
    as_bytes = row_images({"bytes": second.read_bytes(), "path": "b.png"}, tmp_path / "elsewhere")
    assert np.array_equal(_pixels(as_bytes[0]), want[1])
    by_path = row_images({"bytes": None, "path": "b.png"}, tmp_path)
    assert np.array_equal(_pixels(by_path[0]), want[1])


def test_sixteen_bit_samples_are_scaled_not_clipped(tmp_path):
    path = _png(tmp_path / "deep.png", 5, 4, mode="I;16")
    samples = np.asarray(Image.open(path)).astype(np.int64)
    got = _pixels(row_images("deep.png", tmp_path)[0])
    assert np.array_equal(got[..., 0], (samples * 255 + 65535 // 2) // 65535)


def test_a_path_out_of_the_root_is_refused_by_name(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    _png(tmp_path / "secret.png", 4, 4)
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    for value in ("../secret.png", str(tmp_path / "secret.png"), "link.png"):
        with pytest.raises(BadRowImage, match="leaves the image root"):
            row_images(value, root)


def test_a_bomb_a_strip_a_truncated_file_and_not_an_image_are_refused_quickly(tmp_path):
    (tmp_path / "bomb.png").write_bytes(_claimed(8_000, 8_000))  # 64 MP
    (tmp_path / "strip.png").write_bytes(_claimed(1, 2_000_000))
    whole = _png(tmp_path / "whole.png", 64, 64).read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.png").write_text("not an image")
    os.mkfifo(tmp_path / "fifo.png")
    cases = {"bomb.png": "over the 256 MiB an image may take", "strip.png": "an aspect ratio past 200",
             "cut.png": "does not decode", "text.png": "does not decode", "fifo.png": "not a regular file"}
    for name, message in cases.items():
        start = time.monotonic()
        with pytest.raises(BadRowImage, match=message):
            row_images([name], tmp_path)
        assert time.monotonic() - start < 5, name
    with pytest.raises(BadRowImage, match="neither a path nor"):
        row_images(3, tmp_path)
