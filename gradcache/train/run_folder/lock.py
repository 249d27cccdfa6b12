"""Taking a run folder for one job: a lock, the leftovers of an interrupted save removed, and under `torchrun`
one rank deciding for all.

- `RunFolderLock`: `fcntl.flock` on `<folder>/.lock`, which names its holder (pid, host, since); a second job on
  the folder fails at once naming the holder. The kernel releases the lock when the holder's process ends, by
  any means (SIGKILL included), so a lock is never stale; the file itself stays. Rank 0 holds it for the group.
- `remove_stale_temporaries`: the temporary files and folders a save killed half-way leaves (`.last.pt.*.tmp`,
  `last.dcp.partial`), removed at the start of a run or resume, under the lock.
- `decided_by_rank_zero`: rank 0 runs a function (take the lock, choose the checkpoint) and broadcasts what it
  returned, or the error it raised, so every rank continues alike or fails alike, none waiting for the others.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from gradcache import distributed
from gradcache.train.errors import NO_SPACE, CheckpointError, RunFolderDiskFull, RunFolderInUse, UsageError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one job per folder is then up to the user
    fcntl = None

LOCK_FILE = ".lock"
T = TypeVar("T")


class RunFolderLock:
    """The lock of the run folder `folder` (created on `acquire` if missing); a context manager that releases it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._handle = None
        self._created: list[Path] = []  # the folders acquire made, innermost first

    def acquire(self) -> RunFolderLock:
        """Take the lock or raise RunFolderInUse at once; write this job's pid, host and start time into it.
        A folder that cannot be made or written (no permission, a read-only file system, a file in its path)
        raises UsageError naming it, a full disk RunFolderDiskFull (exit 74), and what was made of it is removed
        again."""
        self._created = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if fcntl is None:
                return self
            handle = open(self.path, "a+")
        except OSError as error:
            self.release(discard=True)
            if error.errno in NO_SPACE:
                raise self._disk_full(error) from error
            raise UsageError(f"--output-dir {self.folder} cannot be written ({error.strerror or error}); choose a "
                             "folder you can write to") from error
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            handle.close()
            raise RunFolderInUse(f"run folder {self.folder} is in use by another job ({_describe(holder)}; lock file "
                                 f"{self.path}): one job per run folder. Wait for it to end or stop it, or choose "
                                 "another --output-dir") from None
        self._handle = handle
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
            handle.flush()
        except OSError as error:
            self.release(discard=True)
            if error.errno in NO_SPACE:
                raise self._disk_full(error) from error
            raise
        return self

    def _disk_full(self, error: OSError) -> RunFolderDiskFull:
        return RunFolderDiskFull(error.errno, f"no space left to create the run folder {self.folder} (its lock file "
                                 f"{self.path}); nothing was written. Free space, then the same command")

    def release(self, discard: bool = False) -> None:
        """Let go of the lock; with `discard`, also remove the folders `acquire` created (if nothing else is
        in them): what a run that failed its checks leaves of itself."""
        if discard and self._created:
            if self.folder.is_dir():  # it may not be: acquire failed making it
                self.path.unlink(missing_ok=True)
            for folder in self._created:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None

    def __enter__(self) -> RunFolderLock:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.release()


def _describe(holder: str) -> str:
    try:
        found = json.loads(holder)
        return f"pid {found['pid']} on host {found['host']}, since {found['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown: it is still starting"


TEMPORARY_PATTERNS = (".*.pt.*.tmp", "*.dcp.partial", "*.ds.partial", "*.json.tmp", ".*.aside.tmp")


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove what interrupted saves left in `folder` (call while holding its lock); returns what was removed."""
    removed = [path for pattern in TEMPORARY_PATTERNS for path in sorted(Path(folder).glob(pattern))]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return removed


# the errors a rank-0 decision may raise that every rank re-raises as the same type (all mean exit status 2)
SHARED_ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (UsageError, CheckpointError, RunFolderInUse)}


class RankZeroFailed(RuntimeError):
    """On the other ranks: rank 0's decision raised an error of a type outside SHARED_ERRORS (a bug, or the file
    system's), named in the message. Not a failed collective, so `collective_failures` lets it through."""


def decided_by_rank_zero(decide: Callable[[], T]) -> T:
    """`decide()` on rank 0, its result (picklable) given to every rank; an error it raises is raised on every
    rank (as the same type when it is one of SHARED_ERRORS, else as RankZeroFailed naming it on the other ranks).
    Without a process group, simply `decide()`."""
    if not distributed.is_distributed():
        return decide()
    import torch.distributed as dist

    outcome: list[Any] = [None]
    failure: BaseException | None = None
    if distributed.rank() == 0:
        try:
            outcome[0] = ("ok", decide())
        except Exception as error:  # told to the other ranks, then raised here
            failure = error
            outcome[0] = ("error", type(error).__name__, str(error))
    dist.broadcast_object_list(outcome, src=0)
    if failure is not None:
        raise failure
    if outcome[0][0] == "error":
        _, name, message = outcome[0]
        if name in SHARED_ERRORS:
            raise SHARED_ERRORS[name](message)
        raise RankZeroFailed(f"rank 0: {name}: {message}")
    return outcome[0][1]
