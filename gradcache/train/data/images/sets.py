"""An in-memory image set: uint8 images with optional class labels and captions, and its train/test split.

The built-in data (the procedural shapes, scikit-learn's digits) is small and generated or decoded into this
form at the training resolution; so are the held-out images and SimCLR's kNN reference images of every source.
The training images of an image folder or a caption table stay files (`LazyImageSet`, lazy.py), decoded when
drawn, so a run's memory does not grow with them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradcache.train.data.held_out import held_out_order


def check_descriptions(count: int, labels: torch.Tensor | None, captions: list[str] | None) -> None:
    """Raise ValueError unless `labels` and `captions` (each optional) describe `count` images, one entry each."""
    if labels is not None and labels.shape != (count,):
        raise ValueError(f"labels must have shape ({count},), got {tuple(labels.shape)}")
    if captions is not None and len(captions) != count:
        raise ValueError(f"captions must hold {count} strings, got {len(captions)}")


@dataclass(kw_only=True)
class DescribedImages:
    """N images, in memory (`ImageSet`) or files decoded when drawn (`LazyImageSet`, lazy.py), with what describes
    them: the fields both share, written once.

    Args:
        labels: (N,) int64 class indices into `class_names`, or None when the source has no classes.
        captions: N strings, or None when the source has no captions.
        class_names: the name of each class, or None.
        class_prompts: for each class, the texts whose mean embedding stands for it in zero-shot
            classification, phrased like the captions; None: "a photo of a {name}".
        skipped: what was left out: files that failed to decode (skip-and-count policy) and, for files, entries
            left out before training (table rows without a path or caption, folder entries that are no regular
            files).
    """

    labels: torch.Tensor | None = None
    captions: list[str] | None = None
    class_names: list[str] | None = None
    class_prompts: list[list[str]] | None = None
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_descriptions(len(self), self.labels, self.captions)

    def __len__(self) -> int:
        raise NotImplementedError

    def draw(self, index: int) -> tuple[int, torch.Tensor, int, list[str]]:
        """(the index drawn, its (3, S, S) uint8 image, files read, names that failed)."""
        raise NotImplementedError

    def subset(self, indices: torch.Tensor) -> DescribedImages:
        raise NotImplementedError

    def descriptions_at(self, indices: torch.Tensor) -> dict:
        """The keyword arguments that describe the images at `indices` (1-D int64), in that order."""
        picked = indices.tolist()
        return dict(labels=None if self.labels is None else self.labels[indices],
                    captions=None if self.captions is None else [self.captions[i] for i in picked],
                    class_names=self.class_names, class_prompts=self.class_prompts, skipped=list(self.skipped))


@dataclass(kw_only=True)
class ImageSet(DescribedImages):
    """N images in memory with what describes them (`DescribedImages`).

    Args:
        images: (N, 3, H, W) uint8.
    """

    images: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(
                f"images must be a (N, 3, H, W) uint8 tensor, got {tuple(self.images.shape)} {self.images.dtype}"
            )
        super().__post_init__()

    def __len__(self) -> int:
        return self.images.shape[0]

    def draw(self, index: int) -> tuple[int, torch.Tensor, int, list[str]]:
        """(index, its (3, H, W) uint8 image, 1 read, no failure): `LazyImageSet.draw` for images in memory."""
        return index, self.images[index], 1, []

    def subset(self, indices: torch.Tensor) -> ImageSet:
        """The images at `indices`, with their labels and captions."""
        return ImageSet(images=self.images[indices], **self.descriptions_at(indices))


@dataclass
class DataSplits:
    """The training images (in memory, or files decoded when drawn: data/images/lazy.py), the held-out images
    that the evaluation scores, and for SimCLR the training images its kNN evaluation compares them with
    (`reference`: at most --eval-reference-size, drawn once; None: not drawn)."""

    train: DescribedImages
    test: ImageSet
    name: str
    reference: ImageSet | None = None


def random_split(images: ImageSet, test_size: int, seed: int, name: str) -> DataSplits:
    """Hold out `test_size` images chosen by a permutation that depends only on `seed`."""
    order = held_out_order(len(images), test_size, seed, "images")
    return DataSplits(train=images.subset(order[test_size:]), test=images.subset(order[:test_size]), name=name)
