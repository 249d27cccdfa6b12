"""A row's image value opened for a vision-language model: a path resolved under a root (the data file's folder,
or --image-root), a list of such values (several images in one row), or the `{"bytes", "path"}` mapping that
`datasets` writes an image as in Parquet; each image 8-bit RGB with its size and aspect as they were (the model's
processor resizes it to its pixel budget).

An image is refused (`BadRowImage`, which the reader counts as bad data under --max-bad-share) before it is
decoded where its header tells: a path that leaves the root (`..`, an absolute path or a link elsewhere), a file
that is not a regular one (a FIFO), an image whose decode and the whole RGB copy the processor takes would cost
more than the per-image budget together (decode_budget.py: a decompression bomb, a few KB of PNG that decode to
gigabytes), an aspect ratio past `MAX_ASPECT` (a 1 x 2,000,000 strip; Qwen2-VL's processor refuses past 200);
and after, a file that does not decode whole (truncated, not an image). 16-bit samples are scaled to 8 bits, not clipped (`as_rgb8`).
"""
from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from gradcache.train.data.images.bit_depth import as_rgb8
from gradcache.train.data.images.decode_budget import DECODE_BUDGET_BYTES, ImageOverBudget, decode_cost, opened_image

MAX_ASPECT = 200  # the longer side over the shorter: Qwen2-VL's processor's own bound


class BadRowImage(ValueError):
    """An image value that cannot be used: the row is skipped and counted as bad data."""


def row_images(value: Any, root: str | os.PathLike) -> list[Image.Image]:
    """The images of one row's image value (None or an empty list: none), in order.

    Raises:
        BadRowImage: an image that cannot be used, naming it and why.
    """
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [open_row_image(item, root) for item in items]


def open_row_image(item: Any, root: str | os.PathLike) -> Image.Image:
    """One image value (a path under `root`, or `{"bytes": ..., "path": ...}`) as an 8-bit RGB image."""
    if isinstance(item, Mapping):
        data, name = item.get("bytes"), item.get("path")
        if data is not None:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise BadRowImage(f"image bytes of {name or 'a row'} are a {type(data).__name__}, not bytes")
            return _decoded(io.BytesIO(bytes(data)), f"the image bytes of {name or 'a row'}")
        item = name
    if not isinstance(item, (str, os.PathLike)) or not os.fspath(item):
        raise BadRowImage(f"image value {item!r} is neither a path nor {{'bytes': ..., 'path': ...}}")
    return _decoded(resolved(item, root), os.fspath(item))


def resolved(path: str | os.PathLike, root: str | os.PathLike) -> Path:
    """`path` under `root`, links followed; a path that ends outside `root` is refused (BadRowImage)."""
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / path))
    if target != base and base not in target.parents:
        raise BadRowImage(f"image path {os.fspath(path)!r} leaves the image root {os.fspath(base)!r}; give paths "
                          "inside it, or set --image-root to the folder that holds them")
    return target


def _decoded(source: Any, name: str) -> Image.Image:
    try:
        with opened_image(source) as opened:  # the header alone; the decode itself within the budget
            width, height = opened.size
            kept = decode_cost(width, height, opened.mode) + decode_cost(width, height, "RGB")  # whole, for the processor
            if kept > DECODE_BUDGET_BYTES:
                raise BadRowImage(f"{name} is {width} x {height} pixels: decoding it and keeping it whole as RGB would "
                                  f"take {kept / 2**20:,.0f} MiB, over the {DECODE_BUDGET_BYTES // 2**20} MiB an image "
                                  "may take (a decompression bomb, or a picture larger than a VLM embeds); resize it")
            if max(width, height) > MAX_ASPECT * min(width, height):
                raise BadRowImage(f"{name} is {width} x {height} pixels, an aspect ratio past {MAX_ASPECT}; crop it")
            opened.load()  # a truncated file fails here, not in the processor
            return as_rgb8(opened)
    except BadRowImage:
        raise
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError, SyntaxError, EOFError,
            ImageOverBudget) as error:
        raise BadRowImage(f"{name} does not decode as an image: {error}") from error
