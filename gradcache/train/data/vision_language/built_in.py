"""The built-in data of `gradcache train vlm` (--data shapes): the clip mode's rendered shapes and their captions
(data/images/shapes.py), as rows that mix text-only, image-only and image + text sides, no download.

Training row i is one of three kinds, i mod 3, as benchmarks/vlm_default_run.py's study trained them: (0) an
image -> its caption; (1) a caption -> its image; (2) an image with the caption's place and background words
("in the top left on a dark background") -> the caption, so the model must join what it sees with what it reads.
h = 0. The held-out rows (image -> caption; the mode ranks them both ways) come from an independent stream of the
same seed, as the clip mode's. Images are `IMAGE_SIZE` pixels a side, kept in memory as PIL images.
"""
from __future__ import annotations

import torch
from PIL import Image

from gradcache.train.config import RunConfig
from gradcache.train.data.images.shapes import render_shapes
from gradcache.train.data.vision_language.rows import RowSide, TrainingRows, VisionLanguageRow

BUILT_IN_VLM = "shapes"
IMAGE_SIZE = 32  # the study's
HELD_OUT_STREAM = 1_000_003  # the held-out shapes' seed offset (data/images/shapes.py's `load_shapes`)
PLACE_WORDS = 4  # a caption's words after "a SIZE COLOUR SHAPE": its place and background


def pictures(images: torch.Tensor) -> list[Image.Image]:
    """(N, 3, H, W) uint8 -> N RGB PIL images."""
    return [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in images]


def place(caption: str) -> str:
    """The caption's words after the shape: 'in the top left on a dark background'."""
    return " ".join(caption.split()[PLACE_WORDS:])


def shape_row(kind: int, image: Image.Image, caption: str, where: str) -> VisionLanguageRow:
    """The row of kind `kind` (module docstring) of one shape and its caption."""
    if kind == 0:
        return VisionLanguageRow(RowSide(None, (image,)), RowSide(caption), (), where)
    if kind == 1:
        return VisionLanguageRow(RowSide(caption), RowSide(None, (image,)), (), where)
    return VisionLanguageRow(RowSide(place(caption), (image,)), RowSide(caption), (), where)


def built_in_train(config: RunConfig) -> TrainingRows:
    """--train-size rows of the shapes drawn from --data-seed, cycling through the three kinds."""
    shapes = render_shapes(config.train_size, IMAGE_SIZE, seed=config.data_seed)
    return TrainingRows([shape_row(index % 3, image, caption, f"built-in row {index}") for index, (image, caption)
                         in enumerate(zip(pictures(shapes.images), shapes.captions))])


def built_in_held_out(count: int, seed: int) -> list[VisionLanguageRow]:
    """`count` (image -> caption) rows from the held-out stream of `seed`."""
    shapes = render_shapes(count, IMAGE_SIZE, seed=seed + HELD_OUT_STREAM)
    return [shape_row(0, image, caption, f"built-in held-out row {index}") for index, (image, caption)
            in enumerate(zip(pictures(shapes.images), shapes.captions))]
