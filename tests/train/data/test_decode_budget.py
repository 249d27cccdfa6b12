"""Decoding bounded by what is kept (data/images/decode_budget.py): an image over the per-image budget is refused
from its header before any pixel is read, a FIFO is never opened for a blocking read, and a file PIL rejects with
SyntaxError is a bad file in every split, skipped and counted."""
import io
import os
import struct
import time
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from gradcache.train.data.images import decode_budget
from gradcache.train.data.images.decode_budget import ImageOverBudget, NotRegularFile, decode_cost
from gradcache.train.data.images.files import list_image_folder
from gradcache.train.data.images.lazy import LazyImageSet, decode_image
from gradcache.train.errors import DataReadFailed
from tests.train.hostile_data_corpus import png_chunk, syntax_error_png


def sixteen_bit_header_png(width: int, height: int) -> bytes:
    """A 16-bit greyscale PNG header of `width` x `height` with an IDAT of one row: what the budget reads is the
    header alone, so the pixels need not exist."""
    header = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (2 * width + 1))
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", rows) + png_chunk(b"IEND", b"")


def test_the_thin_16_bit_bomb_is_refused_from_its_header_before_any_pixel_is_read(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    path.write_bytes(sixteen_bit_header_png(1, 60_000_000))

    def no_pixels(self, *args):
        raise AssertionError("pixels were read")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_pixels)
    with pytest.raises(ImageOverBudget, match=r"bomb\.png.*1 x 60000000.*I;16.*572 MiB.*256 MiB"):
        decode_image(path, 16)


@pytest.mark.parametrize("mode, per_pixel, widened", [("I;16", 2, False), ("L", 1, False), ("RGB", 4, False),
                                                      ("I", 4, False), ("P", 1, True), ("RGBA", 4, True),
                                                      ("1", 1, True), ("F", 4, True)])
def test_the_cost_is_the_rows_and_their_pointers_plus_the_rgb_copy_of_a_widened_mode(mode, per_pixel, widened):
    width, height = 7, 5
    expected = height * (width * per_pixel + 8) + (height * (width * 4 + 8) if widened else 0)
    assert decode_cost(width, height, mode) == expected


@pytest.mark.parametrize("mode", ["I;16", "P"])
def test_an_image_at_the_budget_decodes_and_one_byte_over_is_refused(tmp_path, monkeypatch, mode):
    path = tmp_path / "image.png"
    Image.new(mode, (20, 30)).save(path)
    cost = decode_cost(20, 30, Image.open(path).mode)
    monkeypatch.setattr(decode_budget, "DECODE_BUDGET_BYTES", cost)
    assert decode_image(path, 8).shape == (3, 8, 8)
    monkeypatch.setattr(decode_budget, "DECODE_BUDGET_BYTES", cost - 1)
    with pytest.raises(ImageOverBudget):
        decode_image(path, 8)


def test_pils_pixel_limit_is_the_budgets_pixels_at_one_byte():
    assert 2 * Image.MAX_IMAGE_PIXELS == decode_budget.DECODE_BUDGET_BYTES


@pytest.mark.parametrize("width, height", [(300, 200), (40, 900)])
def test_a_16_bit_image_resampled_before_widening_is_within_one_level_of_widening_first(tmp_path, width, height):
    values = np.random.default_rng(width).integers(0, 65536, (height, width)).astype(np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(values).save(path)
    eight_bit = Image.fromarray(((values.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8))  # widened first
    reference_path = tmp_path / "eight.png"
    eight_bit.save(reference_path)
    decoded, reference = decode_image(path, 16), decode_image(reference_path, 16)
    assert (decoded.int() - reference.int()).abs().max() <= 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_at_once_and_left_out_of_a_folder_counted(tmp_path):
    folder = tmp_path / "data" / "cat"
    folder.mkdir(parents=True)
    for index in range(3):
        Image.new("RGB", (8, 8), (index, 0, 0)).save(folder / f"{index}.png")
    os.mkfifo(folder / "zz.png")
    started = time.monotonic()
    with pytest.raises(NotRegularFile, match="zz.png"):
        decode_image(folder / "zz.png", 8)
    assert time.monotonic() - started < 5
    listed = list_image_folder(tmp_path / "data", 8)
    assert [os.path.basename(p) for p in listed.paths] == ["0.png", "1.png", "2.png"]
    assert len(listed.skipped) == 1 and "zz.png" in listed.skipped[0]


def test_a_png_pil_rejects_with_syntax_error_is_skipped_and_counted_in_a_decoded_set(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(syntax_error_png())
    with pytest.raises(SyntaxError):
        Image.open(bad).load()
    with pytest.warns(UserWarning, match="bad.png"):
        decoded = LazyImageSet(paths=[str(good), str(bad)], image_size=8).decoded("held-out")
    assert len(decoded) == 1 and decoded.skipped == [str(bad)]
    assert torch.equal(decoded.images[0], decode_image(good, 8))


def test_an_error_no_decoder_raises_in_a_decoded_set_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "odd.png"
    Image.new("RGB", (8, 8)).save(path)
    monkeypatch.setattr(Image.Image, "resize", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(DataReadFailed, match=r"ZeroDivisionError.*odd\.png.*kNN reference"):
        LazyImageSet(paths=[str(path)], image_size=4).decoded("kNN reference")
