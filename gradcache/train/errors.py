"""What can go wrong in `gradcache train` and `gradcache eval`: each error type carries its exit status, so a
scheduler (or a script) can tell what happened and what to do, and `gradcache.train.cli` maps an error to its
status by type alone. The table of statuses, what each means and what to do next, with torchrun's part in them, is
written once, for users: docs/outputs.md, "Exit statuses".
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

OK = 0
USAGE = 2
DIVERGED = 3
DATA_ERROR = 4
COLLECTIVE_TIMEOUT = 5
DISK_FULL = 74  # EX_IOERR of sysexits.h
PREEMPTED = 75  # EX_TEMPFAIL of sysexits.h
INTERRUPTED = 130  # 128 + SIGINT
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full disk or quota


class UsageError(ValueError):
    """An option value that cannot work; the message names the option, the value and the fix."""

    exit_status = USAGE


class DataError(ValueError):
    """The data named on the command line cannot be used as given (the message says why and what to do)."""

    exit_status = USAGE


class TooMuchBadData(DataError):
    """More of the data than the run allows (`--max-bad-share`) failed to load."""

    exit_status = DATA_ERROR


class DataTooLarge(DataError):
    """Loading or indexing the data ran out of memory; nothing was written (the message says what to do)."""

    exit_status = DATA_ERROR


class DataWorkerFailed(RuntimeError):
    """A data-loader worker raised an error or was killed (by a signal: the out-of-memory killer's SIGKILL, ...);
    the message names the error and the file it was reading, or the signal."""

    exit_status = DATA_ERROR


class DataReadFailed(RuntimeError):
    """Reading a data file at start (a held-out or reference image) raised an error that no decoder raises for a
    bad file; the message names the error and the file."""

    exit_status = DATA_ERROR


class CheckpointError(ValueError):
    """A checkpoint cannot be read, fails its checksum, or does not belong to the run that tries to use it."""

    exit_status = USAGE


class RunFolderInUse(UsageError):
    """Another job holds the run folder's lock; the message names it (pid, host, since)."""


class TrainingDiverged(RuntimeError):
    """The loss, the embeddings, the gradients or the weights became NaN or infinite; the message names what,
    the step and the last good checkpoint."""

    exit_status = DIVERGED


class CollectiveFailure(RuntimeError):
    """A step of a run over several ranks failed in a collective: a peer rank died (at once) or did not answer
    within --collective-timeout; the message names the option."""

    exit_status = COLLECTIVE_TIMEOUT


class DiskFull(OSError):
    """A save ran out of space; the previous checkpoint is untouched and no temporary file is left."""

    exit_status = DISK_FULL

    def __init__(self, folder: Path, needed_bytes: int, free_bytes: int, resumable: bool = True) -> None:
        """`folder`: the run folder; `resumable`: it holds an earlier checkpoint of the run (else the save that
        failed was its first)."""
        self.folder, self.needed_bytes, self.free_bytes = folder, needed_bytes, free_bytes
        then = (f"the checkpoints already there are kept. Free space, then continue with --resume {folder}"
                if resumable else "the run had no checkpoint yet. Free space, then start it again (the same "
                f"command with --resume auto --output-dir {folder} starts it afresh there)")
        super().__init__(errno.ENOSPC, f"no space left to save a checkpoint in {folder}: it needs about "
                         f"{_megabytes(needed_bytes)} free, {_megabytes(free_bytes)} is free; {then}")


class ModelFolderDiskFull(DiskFull):
    """Writing a model folder (RUN/model, `gradcache export`) ran out of space; what the folder held is kept and no
    temporary folder is left."""

    def __init__(self, output: Path, needed_bytes: int, free_bytes: int, again: str) -> None:
        self.folder, self.needed_bytes, self.free_bytes = output, needed_bytes, free_bytes
        OSError.__init__(self, errno.ENOSPC, f"no space left to write the model folder {output}: it needs about "
                         f"{_megabytes(needed_bytes)} free, {_megabytes(free_bytes)} is free; what it held is kept. "
                         f"Free space, then write it with {again}")


class OutputDiskFull(OSError):
    """A command's output file (`gradcache encode`, `eval`, `mine`) did not fit on the disk; nothing was written
    and no partial file is left."""

    exit_status = DISK_FULL

    def __init__(self, output: Path, written_bytes: int, free_bytes: int) -> None:
        self.output, self.written_bytes, self.free_bytes = output, written_bytes, free_bytes
        super().__init__(errno.ENOSPC, f"no space left to write {output}: the disk filled after "
                         f"{_megabytes(written_bytes)} of it, {_megabytes(free_bytes)} is free; nothing was written "
                         "(no partial file is left). Free space or give an --output on another disk, then run the "
                         "command again")

    def __str__(self) -> str:
        return self.strerror


class DataDiskFull(OSError):
    """The disk filled while the data was read or its index written; no partial file is left."""

    exit_status = DISK_FULL

    def __str__(self) -> str:
        return self.strerror


class RunFolderDiskFull(DataDiskFull):
    """The disk filled while the run folder or its lock file was created, before anything else was written; what
    the job made of the folder is removed again."""


class Preempted(Exception):
    """The run stopped on a signal after saving a checkpoint; the message says where and how to resume."""

    exit_status = PREEMPTED

    def __init__(self, message: str, rank: int = 0) -> None:
        super().__init__(message)
        self.rank = rank  # rank 0 alone prints the message


def exit_status_of(error: BaseException) -> int | None:
    """The exit status `error`'s type carries, or None for an error no command raises on purpose (a bug)."""
    return getattr(error, "exit_status", None)


def out_of_space(error: BaseException, folder: str | os.PathLike, needed_bytes: int) -> bool:
    """Whether `error`, raised while `needed_bytes` were written into `folder`, came of a full disk: an ENOSPC or
    EDQUOT anywhere in its chain (torch re-raises a failed write as `RuntimeError: ... unexpected pos`, with the
    OSError as its context; torch.distributed.checkpoint gathers each rank's failure), or, where a library keeps
    no OSError (safetensors reports one in its message alone), less room left in `folder` than the bytes written."""
    if _no_space_in_chain(error):
        return True
    try:
        return shutil.disk_usage(folder).free < needed_bytes
    except OSError:
        return False


def _no_space_in_chain(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return True
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict) and any(_no_space_in_chain(getattr(f, "exc", f)) for f in failures.values()
                                              if isinstance(getattr(f, "exc", f), BaseException)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _megabytes(size: int) -> str:
    """`size` bytes in MiB, to two significant digits below 0.1 MiB (a small checkpoint is not "0.0 MiB")."""
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 / 10 else f"{size / 2**20:.2g} MiB"
