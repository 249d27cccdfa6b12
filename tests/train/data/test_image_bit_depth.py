"""Images of more than 8 bits per sample decode to the same picture in 8 bits: a 16-bit greyscale gradient
(PNG's mode I;16, TIFF's I;16B and a 32-bit I holding 16-bit values) is scaled by 255 / 65535, not clipped to
white."""
import numpy as np
import pytest
from PIL import Image

from gradcache.train.data.images.lazy import decode_image

WIDTH = 64


@pytest.mark.parametrize("dtype, suffix", [(np.uint16, ".png"), (">u2", ".tif"), (np.int32, ".tif")])
def test_a_16_bit_gradient_decodes_to_its_8_bit_values(tmp_path, dtype, suffix):
    values = np.linspace(0, 65535, WIDTH).round().astype(np.int64)  # black to white, left to right
    path = tmp_path / f"gradient{suffix}"
    Image.fromarray(np.repeat(values[None], WIDTH, 0).astype(dtype)).save(path)
    assert Image.open(path).mode in ("I;16", "I;16B", "I")

    decoded = decode_image(path, WIDTH)  # (3, S, S), at its own size: no resampling

    expected = (values * 255 + 65535 // 2) // 65535  # each value on the 8-bit scale, rounded
    for channel in decoded:
        np.testing.assert_array_equal(channel.numpy(), np.repeat(expected[None], WIDTH, 0))
