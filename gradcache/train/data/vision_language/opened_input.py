"""A row's sides opened for the model: each image value decoded (data/images/row_images.py: refused before any
pixel where its header says it would blow up, and 8-bit RGB), the side as the collator takes it
(`VisionLanguageInput`). Built-in rows hold PIL images already; they pass as they are."""
from __future__ import annotations

from pathlib import Path

from PIL import Image

from gradcache.models.vision_language_collator import VisionLanguageInput
from gradcache.train.data.images.row_images import BadRowImage, open_row_image
from gradcache.train.data.vision_language.rows import RowSide, VisionLanguageRow
from gradcache.train.data.vision_language.stored_images import StoredImage


def opened_input(side: RowSide, root: Path | None) -> VisionLanguageInput:
    """`side` with its images opened, relative paths under `side.root`, else `root`.

    Raises:
        BadRowImage: an image that cannot be used (a path leaving the root, no regular file, a decompression
            bomb, an aspect past 200, a file that does not decode whole), naming it and why.
    """
    folder = side.root if side.root is not None else root
    images = []
    for value in side.images:
        if isinstance(value, StoredImage):
            value = value.value()  # its bytes, read from its file
        if isinstance(value, Image.Image):
            images.append(value)
        elif folder is None and not (isinstance(value, dict) and value.get("bytes") is not None):
            raise BadRowImage(f"image path {value!r} has no folder to resolve under; give --image-root")
        else:
            images.append(open_row_image(value, folder if folder is not None else "."))
    return VisionLanguageInput(side.text, tuple(images))


def opened_row(row: VisionLanguageRow, root: Path | None) -> tuple[VisionLanguageInput, list[VisionLanguageInput]]:
    """(the query, [the positive, *the hard negatives]) of `row`, opened.

    Raises:
        BadRowImage: an image of the row that cannot be used.
    """
    passages = [opened_input(side, root) for side in (row.positive, *row.negatives)]
    return opened_input(row.query, root), passages
