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
once, at start (`decoded`), into an in-memory `ImageSet`: a file that fails to decode there is skipped and
counted too; any other error stops the run with DATA_ERROR (4), one line naming the file.

Every decode is bounded before any pixel is read (decode_budget.py: only regular files are opened, and an image
whose decode would cost more than DECODE_BUDGET_BYTES is refused from its header, a bad file like any other).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch
from PIL import Image, UnidentifiedImageError

from gradcache.train.data.held_out import held_out_order
from gradcache.train.data.images.bit_depth import as_rgb8
from gradcache.train.data.images.decode_budget import RESAMPLED_AS_DECODED, ImageOverBudget, opened_image
from gradcache.train.data.images.sets import DataSplits, DescribedImages, ImageSet
from gradcache.train.data.worker_failures import ReadingFailed
from gradcache.train.errors import DataError, DataReadFailed

# How a decoder says a file is no image it can read (PIL's plugins raise SyntaxError for a broken PNG or TIFF
# chunk, EOFError for a short read), with a non-regular file and an image over the budget: skipped and counted.
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
                 ImageOverBudget)


EXACT_ASPECT = 16  # up to this aspect ratio an image is resized whole, then cropped; past it only the kept box


def decode_image(path: str | Path | IO[bytes], image_size: int) -> torch.Tensor:
    """(3, image_size, image_size) uint8: the shorter side resized to `image_size`, then centre-cropped
    (`centre_square`: the work bounded by the pixels kept, whatever the aspect ratio).

    Greyscale of any bit depth and RGB are resampled in their own mode and widened to 8-bit RGB at the kept
    size; other modes are converted to RGB first (their copy counted in the decode budget: decode_budget.py).

    Raises:
        one of DECODE_ERRORS: the file is no image this decoder reads, or its decode is over the budget.
    """
    with opened_image(path) as opened:
        if opened.mode in RESAMPLED_AS_DECODED:
            kept = centre_square(opened, image_size)
        else:
            kept = centre_square(opened.convert("RGB"), image_size)
    cropped = as_rgb8(kept)  # 16-bit samples scaled, not clipped
    return torch.frombuffer(bytearray(cropped.tobytes()), dtype=torch.uint8).view(image_size, image_size, 3).permute(
        2, 0, 1
    )


def centre_square(image: Image.Image, size: int) -> Image.Image:
    """The centre `size` x `size` square of `image` with its shorter side resized (bilinear) to `size`.

    Up to an aspect ratio of EXACT_ASPECT it is the whole image resized, then cropped. Past it the whole resize
    would be mostly thrown away, and would cost memory in proportion to the long side (a 1 x 2,000,000 PNG of
    4 KB would become 16 x 32,000,000 pixels, 3.3 GB): only the box that the crop keeps is resampled, which
    differs from the whole resize by at most one level (rounding in the resampling coordinates).
    """
    width, height = image.size
    scale = size / min(width, height)
    resized_width, resized_height = max(size, round(width * scale)), max(size, round(height * scale))
    left, top = (resized_width - size) // 2, (resized_height - size) // 2
    if max(resized_width, resized_height) <= EXACT_ASPECT * size:
        resized = image.resize((resized_width, resized_height), Image.Resampling.BILINEAR)
        return resized.crop((left, top, left + size, top + size))
    across, down = width / resized_width, height / resized_height  # source pixels per resized pixel
    box = (left * across, top * down, (left + size) * across, (top + size) * down)
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)


@dataclass(kw_only=True)
class LazyImageSet(DescribedImages):
    """N image files with what describes them (`DescribedImages`); nothing decoded until drawn.

    Args:
        paths: N file paths.
        image_size: the side every image is decoded to.
    """

    paths: list[str]
    image_size: int

    def __len__(self) -> int:
        return len(self.paths)

    def draw(self, index: int) -> tuple[int, torch.Tensor, int, list[str]]:
        """(the index drawn, its (3, S, S) uint8 image, files read, names that failed): image `index`, or when it
        fails to decode the next one in file order that does.

        Raises:
            DataError: no image of the set decodes.
            ReadingFailed: decoding a file raised an error that no decoder raises for a bad file (its cause).
        """
        failed = []
        for step in range(len(self.paths)):
            candidate = (index + step) % len(self.paths)
            try:
                return candidate, decode_image(self.paths[candidate], self.image_size), step + 1, failed
            except DECODE_ERRORS:
                failed.append(self.paths[candidate])
            except Exception as error:  # no decoder's way of failing: the run stops, naming the file
                raise ReadingFailed(self.paths[candidate]) from error
        raise DataError(f"none of the {len(self.paths)} training images decodes (first: {self.paths[0]}); "
                        "check that the files are images")

    def subset(self, indices: torch.Tensor) -> LazyImageSet:
        """The files at `indices`, with their labels and captions."""
        return LazyImageSet(paths=[self.paths[i] for i in indices.tolist()], image_size=self.image_size,
                            **self.descriptions_at(indices))

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
            except Exception as error:  # no decoder's way of failing: the run stops, naming the file
                raise DataReadFailed(f"{type(error).__name__}: {error} (while reading {path}, a {what} "
                                     "image)") from error
        if failed:
            shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")
            warnings.warn(f"skipped {len(failed)} of {len(self.paths)} {what} images that failed to decode: {shown}",
                          stacklevel=2)
        if not images:
            raise DataError(f"none of the {len(self.paths)} {what} images decoded (first: "
                            f"{self.paths[0] if self.paths else 'none'}); check that the files are images")
        described = self.descriptions_at(torch.tensor(kept))
        described["skipped"] += failed
        return ImageSet(images=torch.stack(images), **described)


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
