"""What decoding one image may cost, read from its header before any pixel is: cost <= DECODE_BUDGET_BYTES.

PIL keeps a decoded image as rows of samples plus one pointer per row: 1 byte a pixel for modes 1, L and P,
2 for 16-bit greyscale (I;16 and its byte orders), 4 for I, F and every mode of more than one band (RGB
included). Greyscale of any bit depth and RGB are resampled to the kept square as they are and widened to 8-bit
RGB only then (lazy.py), so their cost is that storage; the other modes (palette, bilevel, alpha, CMYK, float)
are converted to RGB before resampling, so their cost adds the 4 bytes a pixel of that copy. An image over the
budget is refused from its header (`ImageOverBudget`, a bad file: skipped and counted): a 175 KB 16-bit PNG of
1 x 60,000,000 pixels would take 600 MB decoded (480 MB of it row pointers) and is refused from its first
33 bytes.

PIL's own limit (`Image.MAX_IMAGE_PIXELS`, set here, once) comes from the same budget: the pixels it holds at one
byte each, the most any image under the budget can have. PIL raises past twice its limit, so it is set to half
of that; its warning between the two is silenced where images are decoded (`opened_image`), since the budget,
not the pixel count, decides.
"""
from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from PIL import Image, ImageMode

DECODE_BUDGET_BYTES = 256 * 2**20  # per image, per process decoding it
ROW_POINTER_BYTES = 8
RGB_PIXEL_BYTES = 4  # PIL keeps RGB as 4 bytes a pixel
RESAMPLED_AS_DECODED = ("L", "RGB", "I", "I;16", "I;16L", "I;16B", "I;16N")  # widened after the resize

Image.MAX_IMAGE_PIXELS = DECODE_BUDGET_BYTES // 2  # PIL raises past twice this: the budget's pixels at 1 byte


class ImageOverBudget(ValueError):
    """An image whose decode would cost more than DECODE_BUDGET_BYTES: a bad file, skipped and counted."""


class NotRegularFile(OSError):
    """A path that names a FIFO, a socket, a device or a folder: no image, and reading it may never end."""


def stored_pixel_bytes(mode: str) -> int:
    """The bytes PIL keeps per pixel of `mode`: a single band's sample size, 4 for any multi-band mode."""
    try:
        description = ImageMode.getmode(mode)
    except KeyError:
        return RGB_PIXEL_BYTES
    if len(description.bands) > 1:
        return RGB_PIXEL_BYTES
    return max(1, int(description.typestr[-1]))  # '|u1', '<u2', '<i4', '<f4', '|b1'


def decode_cost(width: int, height: int, mode: str) -> int:
    """Bytes that decoding a `width` x `height` image of `mode` takes before it is resampled: its rows and their
    pointers, plus an RGB copy for a mode converted before resampling."""
    cost = height * (width * stored_pixel_bytes(mode) + ROW_POINTER_BYTES)
    if mode not in RESAMPLED_AS_DECODED:
        cost += height * (width * RGB_PIXEL_BYTES + ROW_POINTER_BYTES)
    return cost


def check_decode_cost(image: Image.Image, name: str) -> None:
    """Raise `ImageOverBudget` when decoding `image` (opened, its header read, no pixel yet) would cost more than
    DECODE_BUDGET_BYTES; `name` names it."""
    cost = decode_cost(image.width, image.height, image.mode)
    if cost > DECODE_BUDGET_BYTES:
        raise ImageOverBudget(f"{name}: decoding its {image.width} x {image.height} pixels of mode {image.mode} "
                              f"would take {cost / 2**20:,.0f} MiB, over the {DECODE_BUDGET_BYTES // 2**20} MiB an "
                              "image may take")


def open_regular(path: str | os.PathLike) -> IO[bytes]:
    """`path` opened for reading, refused (`NotRegularFile`) unless it is a regular file: opened without blocking
    and checked on the open descriptor, so a FIFO cannot hold the reader and no swap after a check can either."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{os.fspath(path)} is not a regular file (a FIFO, socket, device or folder)")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


@contextmanager
def opened_image(source: str | os.PathLike | IO[bytes]) -> Iterator[Image.Image]:
    """`source` (a path to a regular file, or a file object) opened by PIL with its header read and its decode
    cost checked, no pixel read yet.

    Raises:
        NotRegularFile: a path that is no regular file.
        ImageOverBudget: decoding it would cost more than DECODE_BUDGET_BYTES.
        OSError, SyntaxError, ValueError: PIL's ways of refusing a file that is no image it can read.
    """
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the image"  # a shard's member: named there
    handle = open_regular(source) if isinstance(source, (str, os.PathLike)) else source
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(handle) as image:
                check_decode_cost(image, name)
                yield image
    finally:
        if handle is not source:
            handle.close()
