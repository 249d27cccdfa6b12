"""What can go wrong in `gradcache train`, `eval` and the commands to come: each error type carries its exit
status, so a scheduler (or a script) can tell what happened and what to do, and `gradcache.cli` maps an
error to its status by type alone (the first class in its method resolution order that names one).

    status  name                what happened                                           what to do next
    0       OK                  the command finished                                    nothing
    1       (none)              a bug: an uncaught error, with its traceback            report it
    2       USAGE               a bad option or value, unusable data, a bad checkpoint, fix the command; nothing
                                an output folder that holds another run or job          was trained or written
    3       DIVERGED            the loss, the embeddings, the gradients or the weights  lower --lr, raise --warmup
                                became NaN or infinite; the last good checkpoint is     (or bf16 for fp16), resume
                                kept and no non-finite one is written                   or start afresh
    4       DATA_ERROR          more of the data than --max-bad-share is unreadable     repair the data
    5       COLLECTIVE_TIMEOUT  a peer rank died, or did not answer a collective        resume (a restart does)
                                within --collective-timeout
    74      DISK_FULL           a save ran out of space; the checkpoints already there  free space, then resume:
                                are untouched (74 is EX_IOERR of sysexits.h)            `--resume FOLDER`
    75      PREEMPTED           SIGTERM or SIGINT: the step in progress finished and    requeue: `gradcache train
                                a checkpoint was saved (75 is EX_TEMPFAIL, "try         MODE --resume FOLDER`
                                again later", which requeue hooks understand)
    130     INTERRUPTED         a second SIGTERM/SIGINT, or Ctrl-C before training      resume from the previous
                                started: stopped at once without saving (128 + SIGINT,  checkpoint, which is intact
                                the shell's convention)

Under `torchrun`, every worker exits with its own status and torchrun reports its own to the scheduler: torchrun
treats any non-zero worker status as a failure and, with `--max-restarts` > 0, restarts the whole group. When
the scheduler signals torchrun (or the whole process group, as SLURM does), torchrun forwards the signal, waits
`--shutdown-timeout` seconds (30 by default) for the workers to save and exit, and stops without restarting,
whatever their status. A SIGTERM sent to the workers alone (not to torchrun) makes them save and exit PREEMPTED,
which torchrun counts as a failure: with `--max-restarts` > 0 and `--resume auto` the group restarts from the
checkpoint just saved; with `--max-restarts 0` the job ends there, resumable.
"""
from __future__ import annotations

import errno
from pathlib import Path

OK = 0
USAGE = 2
DIVERGED = 3
DATA_ERROR = 4
COLLECTIVE_TIMEOUT = 5
DISK_FULL = 74  # EX_IOERR of sysexits.h
PREEMPTED = 75  # EX_TEMPFAIL of sysexits.h
INTERRUPTED = 130  # 128 + SIGINT


class UsageError(ValueError):
    """An option value that cannot work; the message names the option, the value and the fix."""

    exit_status = USAGE


class DataError(ValueError):
    """The data named on the command line cannot be used as given (the message says why and what to do)."""

    exit_status = USAGE


class TooMuchBadData(DataError):
    """More of the data than the run allows (`--max-bad-share`) failed to load."""

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

    def __init__(self, folder: Path, needed_bytes: int, free_bytes: int) -> None:
        self.folder, self.needed_bytes, self.free_bytes = folder, needed_bytes, free_bytes
        super().__init__(errno.ENOSPC, f"no space left to save a checkpoint in {folder}: it needs about "
                         f"{_megabytes(needed_bytes)} free, {_megabytes(free_bytes)} is free; the checkpoints "
                         f"already there are kept. Free space, then continue with --resume {folder}")


class Preempted(Exception):
    """The run stopped on a signal after saving a checkpoint; the message says where and how to resume."""

    exit_status = PREEMPTED

    def __init__(self, message: str, rank: int = 0) -> None:
        super().__init__(message)
        self.rank = rank  # rank 0 alone prints the message


def exit_status_of(error: BaseException) -> int | None:
    """The exit status `error`'s type carries, or None for an error no command raises on purpose (a bug)."""
    return getattr(error, "exit_status", None)


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
