"""Training files streamed in order through a shuffle buffer, whatever their format: webdataset shards
(images/shards.py) and streamed text rows (text/streamed_rows.py: `.jsonl.gz`). A format gives its files, how
one file's units are read in order (cheaply: a sample's headers, a line's bytes; a `Damaged` marker where the
file cannot be read on) and what a unit becomes in the buffer (its item, or `Damaged`); its `StreamBatches`
subclass says what a batch of items is. A `Damaged` unit or item is counted once as bad by the batch that draws it and never buffered.

- Order: epoch e permutes the training files (seeded by --seed and e) and deals them to the `ranks x workers`
  slots in turn (slot = rank x workers + worker). With fewer files than slots, every slot reads every file and
  keeps the units numbered r (counted over the files in that order, bad ones too) with r mod slots = slot: row
  striding, which costs every worker a read (a decompression) of all the files. Step t of a rank is made by
  slot `rank x workers + t mod workers`, from that slot's stream: its files one after the other through a
  shuffle buffer of `--shuffle-buffer` items (seeded by seed, epoch, slot). Every rank makes the same number of
  steps per epoch, num_samples // batch_size; a slot whose files run out before its share of the epoch reads
  them again, in a new seeded order (resampled), and what is left at the epoch's end is dropped. The order
  depends on the number of ranks and of workers.
- Resume: the streams are functions of (seed, epoch, slot), so a resumed run skips what its slots had drawn
  (`local batch x steps` items per slot, bad ones not counted), by reading units only, then continues with the
  next unseen items: the same batches as the uninterrupted run when `--workers` and the ranks are the same and
  every bad item was known as it entered the stream (a `.jsonl.gz` row); an item found bad only when its batch
  is made (an image that fails to decode) shifted its slot's stream by one, which the skip does not know. With
  another `--workers` the epoch's remaining steps come from the new slots' streams from their start (items may
  repeat within it).
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gradcache.train.data.worker_failures import WorkerLoader
from gradcache.train.errors import DataError
from gradcache.train.preemption import ignore_stop_signals

SEED_STRIDE = 1_000_003  # seeds of consecutive epochs stay apart from those of nearby run seeds


class Damaged:
    """A unit or item that cannot be used (a file read up to its damage, a row without a field); `name` says which
    and why."""

    def __init__(self, name: str) -> None:
        self.name = name


class StreamedFiles(Protocol):
    """What a format's training data gives the streams: `len` is the epoch length in items."""

    items: str  # what an item is, for messages ("samples", "rows")
    shuffle_buffer: int  # items each worker shuffles among

    @property
    def files(self) -> Sequence[Any]: ...  # what `units` reads, in name order

    def __len__(self) -> int: ...

    def units(self, file: Any) -> Iterator[Any]:
        """The units of `file` in order (a `Damaged` last where it cannot be read on)."""

    def item(self, unit: Any) -> Any:
        """What `unit` is in the buffer, or a `Damaged` (not buffered)."""


class SlotStream:
    """The items of one slot in one epoch: its files (or its stride of them), pass after pass, through a seeded
    shuffle buffer; `items` is the iterator."""

    def __init__(self, data: StreamedFiles, seed: int, epoch: int, slot: int, slots: int) -> None:
        order = torch.randperm(len(data.files),
                               generator=torch.Generator().manual_seed(seed * SEED_STRIDE + epoch)).tolist()
        files = [data.files[i] for i in order]
        self.striding = len(files) < slots
        self.files = files if self.striding else files[slot::slots]
        self.data, self.slot, self.slots = data, slot, slots
        self.random = random.Random(f"{seed}:{epoch}:{slot}")
        self.size = data.shuffle_buffer
        self.items = self._shuffled()

    def _units(self, files: list) -> Iterator[Any]:
        """The units of `files` in order, or when striding those numbered r with r mod slots = slot."""
        number = 0
        for file in files:
            for unit in self.data.units(file):
                if not self.striding or number % self.slots == self.slot:
                    yield unit
                number += 1

    def _shuffled(self) -> Iterator[Any]:
        """Pass after pass over the slot's files (a slot that runs out reads them again, in a new seeded order),
        each pass through the buffer and drained at its end, so a pass yields each of its items once."""
        for number in range(1 << 30):
            files = list(self.files)
            if number:
                self.random.shuffle(files)
            buffer: list = []
            kept = 0
            for unit in self._units(files):
                item = unit if isinstance(unit, Damaged) else self.data.item(unit)
                if isinstance(item, Damaged):
                    yield item  # counted at once, not buffered
                    continue
                kept += 1
                if len(buffer) < self.size:
                    buffer.append(item)
                    continue
                index = self.random.randrange(self.size)
                yield buffer[index]
                buffer[index] = item
            self.random.shuffle(buffer)
            yield from buffer
            if not kept:
                striding = (f" (row striding: fewer files than the {self.slots} ranks x workers, and fewer usable "
                            f"{self.data.items} than them too; use fewer --workers)") if self.striding else ""
                raise DataError(f"{', '.join(map(str, files))} hold no usable {self.data.items} for slot "
                                f"{self.slot}{striding}; check the files")

    def skip(self, count: int) -> None:
        """Pass `count` items, bad ones not counted (a resume)."""
        passed = 0
        while passed < count:
            passed += not isinstance(next(self.items), Damaged)


class StreamBatches(IterableDataset):
    """Each worker makes the steps t (from `start_step`) with t - start_step = its id mod workers, every one from
    slot rank x workers + t mod workers; yields (batch, items read, names of the bad ones). A format's subclass
    says what a batch holds of an item (`example`) and how examples make a batch (`collate`)."""

    def __init__(self, data: StreamedFiles, seed: int, batch_size: int, start_step: int, total_steps: int, rank: int,
                 world_size: int, workers: int) -> None:
        self.data, self.seed, self.local = data, seed, batch_size // world_size
        self.start_step, self.total_steps, self.rank, self.world_size = start_step, total_steps, rank, world_size
        self.workers = max(workers, 1)
        self.steps_per_epoch = len(data) // batch_size

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        return self.worker_batches(0 if info is None else info.id)

    def worker_batches(self, worker: int) -> Iterator:
        """The batches of loader worker `worker`, in step order."""
        streams: dict[int, SlotStream] = {}
        for step in range(self.start_step + worker, self.total_steps, self.workers):
            epoch, within = divmod(step, self.steps_per_epoch)
            lane = step % self.workers
            if epoch not in streams:
                streams = {epoch: SlotStream(self.data, self.seed, epoch, self.rank * self.workers + lane,
                                             self.world_size * self.workers)}
                epoch_start = epoch * self.steps_per_epoch
                streams[epoch].skip(self.local * sum(1 for t in range(epoch_start, step) if t % self.workers == lane))
            yield self._batch(streams[epoch], epoch, within)

    def _batch(self, stream: SlotStream, epoch: int, within: int):
        examples, read, failed = [], 0, []
        while len(examples) < self.local:
            item = next(stream.items)
            read += 1
            if not isinstance(item, Damaged):
                position = within * self.local * self.world_size + self.rank * self.local + len(examples)
                item = self.example(item, epoch, position)
            if isinstance(item, Damaged):
                failed.append(item.name)
                continue
            examples.append(item)
        return self.collate(examples), read, failed

    def example(self, item: Any, epoch: int, position: int) -> Any:
        """What the batch holds of `item`, the `position`-th of epoch `epoch`'s global order (or a `Damaged`)."""
        return item

    def collate(self, examples: list) -> Any:
        """One batch of `examples`."""
        raise NotImplementedError


def _as_is(batch):
    return batch


def stream_loader(batches: StreamBatches, workers: int) -> DataLoader:
    """The loader of `batches`: its workers' batches in turn (step order), drawing nothing from the global state;
    a worker that raises or dies stops the run (`WorkerLoader`: DataWorkerFailed, status 4)."""
    return WorkerLoader(batches, batch_size=None, num_workers=workers, collate_fn=_as_is,
                      prefetch_factor=2 if workers else None, worker_init_fn=ignore_stop_signals,
                      generator=torch.Generator().manual_seed(batches.seed))
