"""The data order and the batches of a run, both pure functions of (seed, step): what makes resume exact.

Epoch e visits the training images in `randperm(N)` drawn from a generator seeded by (seed, e); step s of a run
takes the s-th global batch of that order (the last partial batch of an epoch is dropped, so every step sees
`batch_size` images). Sample i of epoch e is augmented under its own seed, a function of (seed, e, i), so the
views do not depend on which process or worker draws them, nor on the global random state; a run resumed at
step s therefore sees exactly the batches the uninterrupted run saw. Under torch.distributed each rank takes its
contiguous slice of the global batch, so the ranks' slices, gathered by rank, form the global batch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gradcache.train.data.images.augment import to_model_input
from gradcache.train.data.bad_data import BadShare, CountedBatches
from gradcache.train.data.images.lazy import LazyImageSet
from gradcache.train.data.images.sets import ImageSet
from gradcache.train.preemption import ignore_stop_signals

_EPOCH_STRIDE = 1_000_003  # seeds of consecutive epochs stay apart from those of nearby run seeds


def epoch_order(count: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of `count` images that epoch `epoch` of a run seeded `seed` visits."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed * _EPOCH_STRIDE + epoch))


class StepSampler(Sampler[list[tuple[int, int]]]):
    """Yields, for each step from `start_step` to `total_steps`, this rank's (epoch, index) pairs."""

    def __init__(self, count: int, batch_size: int, seed: int, start_step: int, total_steps: int,
                 rank: int = 0, world_size: int = 1) -> None:
        if batch_size > count:
            raise ValueError(f"--batch-size {batch_size} exceeds the {count} training images; "
                             "pass a smaller --batch-size or use more data")
        self.count, self.batch_size, self.seed = count, batch_size, seed
        self.start_step, self.total_steps = start_step, total_steps
        self.rank, self.world_size = rank, world_size
        self.steps_per_epoch = count // batch_size

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within the epoch) of global step `step`."""
        return divmod(step, self.steps_per_epoch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        local = self.batch_size // self.world_size
        order, order_epoch = None, -1
        for step in range(self.start_step, self.total_steps):
            epoch, within = self.position(step)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(self.count, self.seed, epoch), epoch
            start = within * self.batch_size + self.rank * local
            yield [(epoch, index) for index in order[start:start + local].tolist()]

    def __len__(self) -> int:
        return self.total_steps - self.start_step


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
            return to_model_input(image), self.images.captions[index]
        # Seed and restore only the CPU generator that torchvision's transforms draw from: torch.manual_seed and
        # fork_rng also visit every accelerator backend, which cost a quarter of the augmentation time.
        generator = torch.default_generator
        outer = generator.get_state()
        generator.manual_seed((self.seed * _EPOCH_STRIDE + epoch) * 10_000_019 + index)
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


def step_loader(dataset: Dataset, sampler: StepSampler, collate: Callable, workers: int) -> DataLoader:
    """A loader of one collated batch per step of `sampler`, that draws nothing from the global random state.

    A DataLoader draws its workers' base seed when its iterator is created, from its `generator`, or when that
    is None from the global generator: a fresh run creates the iterator once at step 0, a resumed run at the
    checkpoint's step, just after restoring the global state, so that one draw would shift every dropout mask
    and random number after it. Its own generator, seeded by the run seed, keeps the global state the
    checkpoint's (what each sample draws is seeded by (seed, epoch, index), so the workers' seeds matter not).
    """
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate,
                      persistent_workers=False, prefetch_factor=2 if workers else None,
                      worker_init_fn=ignore_stop_signals, generator=torch.Generator().manual_seed(sampler.seed))
