"""A data-loader worker that raises or dies ends the run at once, with DATA_ERROR (4) and one line that names
the worker's error (and the file it was reading) or the signal that killed it, and no worker left behind.

torch re-raises a worker's exception in the main process as a new one whose message is the worker's whole
traceback, and reports a killed worker by a RuntimeError that its SIGCHLD handler may raise anywhere in the main
process. So the error is caught in the worker itself: `WorkerLoader` wraps the dataset and the collate so that,
in a worker, an exception becomes a `WorkerFailure` value delivered in place of the batch; the main process
raises it as `DataWorkerFailed`. A worker that died is found by its exit code (`dead_worker`), in `WorkerLoader`
when the loader raises and in the training loop for the handler's RuntimeError. Stopping the others: the
iterator's own shutdown (its SIGTERM, which a worker obeys from its main process: preemption.py), then SIGKILL
for any still alive. A worker that sends no batch within BATCH_WAIT_SECONDS (a read that never ends) ends the run
the same way, naming the wait. With `--workers 0` nothing is wrapped: an error is raised where it happens, with its
traceback.
"""
from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from gradcache.train.errors import DataWorkerFailed

_STOP_SECONDS = 10.0  # a worker still alive this long after the loader's shutdown is killed
# the longest the run waits for one batch from its workers: far above any batch's reading time, so that a worker
# stuck in a read that never ends (a FIFO, a share that stopped answering) stops the run instead of hanging it
BATCH_WAIT_SECONDS = 600.0
_running: list = []  # the worker processes of the loader being iterated (for `dead_worker`)


class ReadingFailed(Exception):
    """An error that is no decoding failure (those are skipped and counted), raised while reading `path`; its
    cause is the error itself. A worker's report names the file."""

    def __init__(self, path: str) -> None:
        super().__init__(f"while reading {path}")
        self.path = path


class WorkerFailure:
    """What a worker sends in place of a batch when it raised: `message` names the worker, the error and the
    file it was reading."""

    def __init__(self, message: str) -> None:
        self.message = message


class WorkerLoader(DataLoader):
    """A DataLoader whose iteration raises `DataWorkerFailed` (status 4, one line) when a worker raises or dies,
    or no batch comes within its `timeout` (BATCH_WAIT_SECONDS unless given), after stopping every worker. The dataset and collate are wrapped (`_ReportedItems`, `_ReportedStream`,
    `_ReportedCollate`); arguments as DataLoader's. Batches are pinned (`pin_memory`) when CUDA is initialised
    in this process, as the run's placement does for a CUDA device before the loader is built, so each batch
    crosses to the device without blocking the host (`run.py`)."""

    def __init__(self, dataset: Dataset, collate_fn: Callable, **options: Any) -> None:
        options.setdefault("pin_memory", torch.cuda.is_initialized())
        if options.get("num_workers", 0) > 0:
            options.setdefault("timeout", BATCH_WAIT_SECONDS)
        reported = _ReportedStream(dataset) if isinstance(dataset, IterableDataset) else _ReportedItems(dataset)
        super().__init__(reported, collate_fn=_ReportedCollate(collate_fn), **options)

    def __iter__(self) -> Iterator:
        before = set(multiprocessing.active_children())
        batches = super().__iter__()
        workers = [process for process in multiprocessing.active_children() if process not in before]
        _running[:] = workers
        failure = None
        while failure is None:
            asked = time.monotonic()
            try:
                batch = next(batches)
            except StopIteration:
                _running[:] = []
                return
            except RuntimeError:
                failure = dead_worker(workers)
                if failure is None and self.timeout and time.monotonic() - asked >= self.timeout:
                    failure = DataWorkerFailed(
                        f"no batch came from the {len(workers)} data-loader workers in {self.timeout:g} s: one is "
                        "stuck reading (a file that never ends, a disk or network share that stopped answering); "
                        "the run stopped. Check the data's storage, or run with --workers 0 to see where it waits")
                    for process in workers:  # stuck in a read: asking it to stop would wait on the read too
                        process.kill()
                if failure is None:  # not a worker's death: the loader's own error
                    raise
            else:
                if isinstance(batch, WorkerFailure):
                    failure = DataWorkerFailed(batch.message)
                else:
                    yield batch
        del batches  # the iterator's shutdown: the workers are told to stop (those that do not are killed below)
        _stop(workers)
        raise failure


def dead_worker(workers: list | None = None) -> DataWorkerFailed | None:
    """The failure of the first of `workers` (default: those of the loader being iterated) that died, naming
    its signal or exit status; None while every one lives (or ended with status 0)."""
    workers = _running if workers is None else workers
    if workers:
        wait([process.sentinel for process in workers], timeout=1.0)  # torch saw the death first: let it land
    for process in workers:
        code = process.exitcode
        if code is None or code == 0:
            continue
        if code < 0:
            cause = f"was killed by {_signal_name(-code)}"
            advice = ("if memory ran out (the out-of-memory killer sends SIGKILL), lower --workers or --batch-size"
                      if -code == signal.SIGKILL else "see what sent the signal")
        else:
            cause, advice = f"exited with status {code}", "run with --workers 0 to see the error"
        return DataWorkerFailed(f"a data-loader worker (pid {process.pid}) {cause}; the run stopped. "
                                f"{advice[0].upper()}{advice[1:]}")
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal: no name
        return f"signal {signum}"


def _stop(workers: list) -> None:
    """Wait for `workers` to end (the loader's shutdown asked them to), and kill those that do not."""
    wait([process.sentinel for process in workers], timeout=_STOP_SECONDS)
    for process in workers:
        if process.is_alive():
            process.kill()
            process.join()
    _running[:] = []


def _report(error: Exception) -> WorkerFailure:
    """The one line that names the worker, the error, and the file it was reading."""
    cause = error.__cause__ if isinstance(error, ReadingFailed) and error.__cause__ is not None else error
    what = " ".join(f"{type(cause).__name__}: {cause}".split())
    if isinstance(error, ReadingFailed):
        return WorkerFailure(f"data-loader worker {get_worker_info().id} failed reading {error.path}: {what}; "
                             "repair or remove the file (--workers 0 shows the traceback)")
    return WorkerFailure(f"data-loader worker {get_worker_info().id} failed: {what} (--workers 0 shows the "
                         "traceback)")


class _ReportedItems(Dataset):
    """`dataset`, whose batch in a worker is a `WorkerFailure` when drawing it raised."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __getitems__(self, indices: list):
        try:
            if hasattr(self.dataset, "__getitems__"):
                return self.dataset.__getitems__(indices)
            return [self.dataset[index] for index in indices]
        except Exception as error:
            if get_worker_info() is None:
                raise
            return _report(error)


class _ReportedStream(IterableDataset):
    """`stream`, which in a worker ends with a `WorkerFailure` when it raised."""

    def __init__(self, stream: IterableDataset) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator:
        items = iter(self.stream)
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception as error:
                if get_worker_info() is None:
                    raise
                yield _report(error)
                return
            yield item


class _ReportedCollate:
    """`collate`, passing a `WorkerFailure` on, and making one of its own error in a worker."""

    def __init__(self, collate: Callable) -> None:
        self.collate = collate

    def __call__(self, items):
        if isinstance(items, WorkerFailure):
            return items
        try:
            return self.collate(items)
        except Exception as error:
            if get_worker_info() is None:
                raise
            return _report(error)
