"""The data order of every mode that reads its examples by index, a pure function of (seed, step): what makes
resume exact.

Epoch e visits the N training examples in `randperm(N)` drawn from a generator seeded by (seed, e) (`epoch_seed`);
step s of a run takes the s-th global batch of that order (the last partial batch of an epoch is dropped, so every
step sees `batch_size` examples). What a step draws is therefore a function of (seed, step), the same whatever the
process or worker that draws it, and a run resumed at step s sees exactly the batches the uninterrupted run saw.
Under torch.distributed each rank takes its contiguous slice of the global batch, so the ranks' slices, gathered
by rank, form the global batch. `step_loader` turns the order into a loader of one batch per step; each mode's
batches build on it (gradcache/train/data/images/training_batches.py, gradcache/train/data/text/batches.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gradcache.train.data.worker_failures import WorkerLoader
from gradcache.train.preemption import ignore_stop_signals

_EPOCH_STRIDE = 1_000_003  # seeds of consecutive epochs stay apart from those of nearby run seeds


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch `epoch` of a run seeded `seed`: its order's, and the root of its samples' own seeds."""
    return seed * _EPOCH_STRIDE + epoch


def epoch_order(count: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of `count` examples that epoch `epoch` of a run seeded `seed` visits."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(epoch_seed(seed, epoch)))


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


def step_loader(dataset: Dataset, sampler: StepSampler, collate: Callable, workers: int) -> DataLoader:
    """A loader of one collated batch per step of `sampler`, that draws nothing from the global random state.

    A DataLoader draws its workers' base seed when its iterator is created, from its `generator`, or when that
    is None from the global generator: a fresh run creates the iterator once at step 0, a resumed run at the
    checkpoint's step, just after restoring the global state, so that one draw would shift every dropout mask
    and random number after it. Its own generator, seeded by the run seed, keeps the global state the
    checkpoint's (what each sample draws is seeded by (seed, epoch, index), so the workers' seeds matter not).
    A worker that raises or dies stops the run (`WorkerLoader`: DataWorkerFailed, status 4).
    """
    return WorkerLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate,
                      persistent_workers=False, prefetch_factor=2 if workers else None,
                      worker_init_fn=ignore_stop_signals, generator=torch.Generator().manual_seed(sampler.seed))
