"""The training batches of the image modes: per step, SimCLR's two views of each image, or CLIP's images with
their tokenised captions.

Step s draws the (epoch, index) pairs that the run's `StepSampler` gives (gradcache/train/data/order.py), so the
batches are a function of (seed, step) and resume is exact. Image i of epoch e is augmented under its own seed,
a function of (seed, e, i), so the views depend neither on the process or worker that draws them nor on the
global random state.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Dataset

from gradcache.train.data.bad_data import BadShare, CountedBatches
from gradcache.train.data.images.lazy import LazyImageSet
from gradcache.train.data.images.sets import ImageSet
from gradcache.train.data.order import StepSampler, epoch_seed, step_loader


class AugmentedPairs(Dataset):
    """Item (epoch, i): two SimCLR views of image i (or, with `captions`, image i and its caption); image i is
    decoded here (in the worker) when the set keeps files, replaced by the next one in file order that decodes
    when it does not (`LazyImageSet.draw`)."""

    def __init__(self, images: ImageSet | LazyImageSet, seed: int, augmentation: Callable | None,
                 captions: bool) -> None:
        self.images, self.seed, self.augmentation, self.captions = images, seed, augmentation, captions

    def __len__(self) -> int:
        return len(self.images)

    def __getitems__(self, items: list[tuple[int, int]]) -> Drawn:
        """A whole batch on one thread (per-image ops are tiny, and a thread pool only adds waiting), with the
        count of files read and the names of those that failed to decode."""
        drawn = Drawn()
        with _one_thread():
            for item in items:
                drawn.append(self._draw(item, drawn))
        return drawn

    def __getitem__(self, item: tuple[int, int]):
        return self._draw(item, Drawn())

    def _draw(self, item: tuple[int, int], drawn: Drawn):
        epoch, index = item
        index, image, read, failed = self.images.draw(index)
        drawn.read += read
        drawn.failed.extend(failed)
        if self.captions:
            return image, self.images.captions[index]  # uint8: normalised on the device (run.py)
        # Seed and restore only the CPU generator that torchvision's transforms draw from: torch.manual_seed and
        # fork_rng also visit every accelerator backend, which cost a quarter of the augmentation time.
        generator = torch.default_generator
        outer = generator.get_state()
        generator.manual_seed(epoch_seed(self.seed, epoch) * 10_000_019 + index)
        try:
            return self.augmentation(image), self.augmentation(image)
        finally:
            generator.set_state(outer)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Drawn(list):
    """The items of one batch, with `read` (image files read for them) and `failed` (those that did not decode)."""

    def __init__(self) -> None:
        super().__init__()
        self.read, self.failed = 0, []


def _stack_pairs(items: Drawn) -> tuple[tuple[torch.Tensor, torch.Tensor], int, list[str]]:
    first, second = zip(*items)
    return (torch.stack(first), torch.stack(second)), items.read, items.failed  # (B, 3, H, W) each


class _CaptionCollate:
    """Stacks images and tokenises captions (a class, not a lambda, so worker processes can pickle it)."""

    def __init__(self, tokenizer: Callable) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: Drawn):
        images, captions = zip(*items)
        return (torch.stack(images), self.tokenizer(list(captions))), items.read, items.failed


def training_batches(images: ImageSet | LazyImageSet, sampler: StepSampler, augmentation: Callable | None,
                     tokenizer: Callable | None, workers: int, max_bad_share: float = 0.0) -> CountedBatches:
    """SimCLR view pairs (tokenizer None) or CLIP (images, tokens) batches, one per step; the images that fail to
    decode when drawn are added to `images.skipped`, and more than `max_bad_share` of those read so far (once
    `BAD_SHARE_MIN_READS` were read) raises `TooMuchBadData`."""
    pairs = AugmentedPairs(images, sampler.seed, augmentation, captions=tokenizer is not None)
    collate = _stack_pairs if tokenizer is None else _CaptionCollate(tokenizer)
    return CountedBatches(step_loader(pairs, sampler, collate, workers), BadShare(max_bad_share, images.skipped))
