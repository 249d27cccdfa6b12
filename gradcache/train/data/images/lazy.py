"""An image set kept as file paths, each image decoded when a batch draws it: memory that does not grow with the
data beyond one path (and a label or caption) per image.

`LazyImageSet.draw(i)` decodes image i at the run's `image_size` (`decode_image`: shorter side resized, centre
crop); it runs in the data-loader workers. An image that fails to decode is skipped and counted, and the batch
keeps its size: the draw takes the next image in file order, i + 1, i + 2, ... (modulo N), the first that
decodes. The replacement is a function of i alone, so the batches stay a function of (seed, epoch, step), the
same whatever the number of workers and wherever a run was resumed. Each draw reports how many files it read
and the names of those that failed; `CountedBatches` (data/bad_data.py) adds them up as the run goes and checks
--max-bad-share on the share read so far (`BadShare`).

The held-out images and SimCLR's kNN reference set are small and read at every evaluation, so they are decoded
once, at start (`decoded`), into an in-memory `ImageSet`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from gradcache.train.data.held_out import held_out_order
from gradcache.train.data.images.bit_depth import as_rgb8
from gradcache.train.data.images.sets import DataSplits, ImageSet, check_descriptions
from gradcache.train.errors import DataError

DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError)


def decode_image(path: str | Path, image_size: int) -> torch.Tensor:
    """(3, image_size, image_size) uint8: the shorter side resized to `image_size`, then centre-cropped."""
    with Image.open(path) as opened:
        image = as_rgb8(opened)  # 16-bit samples scaled, not clipped
    width, height = image.size
    scale = image_size / min(width, height)
    resized = image.resize((max(image_size, round(width * scale)), max(image_size, round(height * scale))),
                           Image.Resampling.BILINEAR)
    left = (resized.width - image_size) // 2
    top = (resized.height - image_size) // 2
    cropped = resized.crop((left, top, left + image_size, top + image_size))
    return torch.frombuffer(bytearray(cropped.tobytes()), dtype=torch.uint8).view(image_size, image_size, 3).permute(
        2, 0, 1
    )


@dataclass
class LazyImageSet:
    """N image files with what describes them; nothing decoded until drawn.

    Args:
        paths: N file paths.
        image_size: the side every image is decoded to.
        labels: (N,) int64 class indices into `class_names`, or None.
        captions: N strings, or None.
        class_names, class_prompts: as in `ImageSet`.
        skipped: entries left out before training (table rows without a path or caption) and, as the run goes,
            the files that failed to decode (added by `CountedBatches` in the training process).
    """

    paths: list[str]
    image_size: int
    labels: torch.Tensor | None = None
    captions: list[str] | None = None
    class_names: list[str] | None = None
    class_prompts: list[list[str]] | None = None
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_descriptions(len(self.paths), self.labels, self.captions)

    def __len__(self) -> int:
        return len(self.paths)

    def draw(self, index: int) -> tuple[int, torch.Tensor, int, list[str]]:
        """(the index drawn, its (3, S, S) uint8 image, files read, names that failed): image `index`, or when it
        fails to decode the next one in file order that does.

        Raises:
            DataError: no image of the set decodes.
        """
        failed = []
        for step in range(len(self.paths)):
            candidate = (index + step) % len(self.paths)
            try:
                return candidate, decode_image(self.paths[candidate], self.image_size), step + 1, failed
            except DECODE_ERRORS:
                failed.append(self.paths[candidate])
        raise DataError(f"none of the {len(self.paths)} training images decodes (first: {self.paths[0]}); "
                        "check that the files are images")

    def subset(self, indices: torch.Tensor) -> LazyImageSet:
        """The files at `indices`, with their labels and captions."""
        picked = indices.tolist()
        return LazyImageSet(
            paths=[self.paths[i] for i in picked], image_size=self.image_size,
            labels=None if self.labels is None else self.labels[indices],
            captions=None if self.captions is None else [self.captions[i] for i in picked],
            class_names=self.class_names, class_prompts=self.class_prompts, skipped=list(self.skipped),
        )

    def decoded(self, what: str) -> ImageSet:
        """Every image decoded into memory (for the small held-out and reference sets), those that fail skipped,
        counted in `skipped` and named in a warning; `what` names the set in messages.

        Raises:
            DataError: none decodes.
        """
        images, kept, failed = [], [], []
        for index, path in enumerate(self.paths):
            try:
                images.append(decode_image(path, self.image_size))
                kept.append(index)
            except DECODE_ERRORS:
                failed.append(path)
        if failed:
            shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")
            warnings.warn(f"skipped {len(failed)} of {len(self.paths)} {what} images that failed to decode: {shown}",
                          stacklevel=2)
        if not images:
            raise DataError(f"none of the {len(self.paths)} {what} images decoded (first: "
                            f"{self.paths[0] if self.paths else 'none'}); check that the files are images")
        keep = torch.tensor(kept)
        return ImageSet(images=torch.stack(images), labels=None if self.labels is None else self.labels[keep],
                        captions=None if self.captions is None else [self.captions[i] for i in kept],
                        class_names=self.class_names, class_prompts=self.class_prompts,
                        skipped=list(self.skipped) + failed)


def lazy_split(data: LazyImageSet, test_size: int, seed: int, name: str) -> DataSplits:
    """Hold out `test_size` files chosen by the permutation of `random_split` (the same images an in-memory set
    of the same files would hold out), decoded now; the rest stay files. The held-out images that fail to decode
    are left out, and counted in the training set's `skipped` (what the run reports)."""
    try:
        order = held_out_order(len(data), test_size, seed, "images")
    except ValueError as error:
        raise DataError(f"{name}: {error}") from error
    test = data.subset(order[:test_size]).decoded("held-out")
    train = data.subset(order[test_size:])
    train.skipped = test.skipped  # the rows left out when the table was read, and the held-out files that failed
    return DataSplits(train=train, test=test, name=name)


def reference_set(train: ImageSet | LazyImageSet, size: int | None, seed: int) -> ImageSet:
    """At most `size` training images, in memory, for SimCLR's kNN evaluation and its raw-pixel baseline: all of
    them when there are no more (or `size` is None, as runs before version 9 scored), else the first `size` of a
    permutation seeded by `seed` (a stream apart from the held-out split's)."""
    if size is None or len(train) <= size:
        picked = torch.arange(len(train))
    else:
        picked = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + _REFERENCE_STREAM))[:size]
        picked = picked.sort().values  # file order: the same images whatever the order of drawing
    subset = train.subset(picked)
    return subset.decoded("kNN reference") if isinstance(subset, LazyImageSet) else subset


_REFERENCE_STREAM = 0x5EED_0F_4E  # keeps the reference draw apart from the held-out permutation of the same seed
