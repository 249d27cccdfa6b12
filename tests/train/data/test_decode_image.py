"""`decode_image`: the shorter side resized to the image size, then the centre square; the work and memory bounded
by the pixels it keeps, so a thin image of a few kilobytes cannot take gigabytes."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from gradcache.train.data.images.lazy import decode_image


def _full_resize_then_crop(path, size: int) -> torch.Tensor:
    """What decoding did before it was bounded: the whole image resized, then the centre square cropped."""
    with Image.open(path) as opened:
        image = opened.convert("RGB")
    scale = size / min(image.size)
    resized = image.resize((max(size, round(image.width * scale)), max(size, round(image.height * scale))),
                           Image.Resampling.BILINEAR)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    return torch.from_numpy(np.asarray(resized.crop((left, top, left + size, top + size))).copy()).permute(2, 0, 1)


def _noise(path, width: int, height: int, seed: int, mode: str = "RGB"):
    rng = np.random.default_rng(seed)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)
    return path


@pytest.mark.parametrize("width, height", [(12, 10), (10, 12), (64, 48), (37, 211), (300, 41), (16, 16), (5, 7)])
@pytest.mark.parametrize("size", [8, 16, 24])
def test_ordinary_images_decode_as_the_full_resize_cropped(tmp_path, width, height, size):
    path = _noise(tmp_path / "image.png", width, height, seed=width * 1000 + height)
    decoded = decode_image(path, size)
    assert decoded.shape == (3, size, size) and decoded.dtype == torch.uint8
    assert torch.equal(decoded, _full_resize_then_crop(path, size))


@pytest.mark.parametrize("width, height", [(4, 400), (900, 6), (1, 300)])
def test_a_thin_image_decodes_to_the_centre_square_of_the_full_resize_within_one_level(tmp_path, width, height):
    path = _noise(tmp_path / "thin.png", width, height, seed=width + height, mode="L")
    decoded, full = decode_image(path, 16), _full_resize_then_crop(path, 16)
    assert decoded.shape == full.shape == (3, 16, 16)
    assert (decoded.int() - full.int()).abs().max() <= 1


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def _reset_peak_rss() -> None:
    """The peak resident size (VmHWM) starts again from the present one (Linux: 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads the peak memory from /proc")
def test_a_one_pixel_wide_image_of_two_million_rows_costs_less_than_100_mb(tmp_path):
    path = tmp_path / "thin.png"
    rows = np.zeros((2_000_000, 1), dtype=np.uint8)
    rows[::2] = 255  # stripes: something to resample, still a few kilobytes of PNG
    Image.fromarray(rows, "L").save(path)
    del rows
    _reset_peak_rss()
    before = _peak_rss_kib()
    image = decode_image(path, 16)
    extra_kib = _peak_rss_kib() - before
    assert image.shape == (3, 16, 16)
    assert extra_kib < 100 * 1024, f"decoding {path} took {extra_kib / 1024:.0f} MiB more"
