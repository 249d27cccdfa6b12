"""An opened image as 8-bit RGB, its values scaled rather than clipped.

PIL's `convert("RGB")` clips integer modes of more than 8 bits: a 16-bit greyscale PNG (mode I;16, or I) turns
white wherever a value passes 255. `as_rgb8` maps 16-bit samples onto 0..255 first (v * 255 / 65535, rounded),
so the picture the user gave is the picture trained on. Mode I (32-bit integers) is read on the 16-bit scale,
which is what a 16-bit PNG or TIFF opens as; values past 65535 are clipped to white. `decode_image` (lazy.py)
calls it on the kept square, resampled in its own mode, so the arrays here are the size of what is kept.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
SIXTEEN_BIT_MAX = 65535


def as_rgb8(image: Image.Image) -> Image.Image:
    """`image` as mode RGB; greyscale samples of 16 bits scaled to 8 bits."""
    if image.mode not in SIXTEEN_BIT_MODES:
        return image.convert("RGB")
    samples = np.clip(np.asarray(image).astype(np.int64), 0, SIXTEEN_BIT_MAX)  # (H, W)
    eight_bit = ((samples * 255 + SIXTEEN_BIT_MAX // 2) // SIXTEEN_BIT_MAX).astype(np.uint8)
    return Image.fromarray(eight_bit, mode="L").convert("RGB")
