"""torchrun's variables, read with bounds: 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE,
each a whole number below MAX_PROCESSES.

A value no launcher writes (LOCAL_RANK=abc or empty, LOCAL_RANK=-1, WORLD_SIZE=0, RANK past WORLD_SIZE) stops the
command at start with UsageError (exit 2), one line naming the variable, instead of a traceback from `int` or from
torch's rendezvous. Without torchrun none is set, and the defaults are one process of rank 0.
"""
from __future__ import annotations

import os

from gradcache.train.errors import UsageError

MAX_PROCESSES = 1 << 20  # far above any job's ranks; a bound for values that index or size per-rank lists
DEFAULTS = {"WORLD_SIZE": 1, "RANK": 0, "LOCAL_WORLD_SIZE": 1, "LOCAL_RANK": 0}
_SMALLEST = {"WORLD_SIZE": 1, "RANK": 0, "LOCAL_WORLD_SIZE": 1, "LOCAL_RANK": 0}


def launch_variable(name: str) -> int:
    """The whole number in the environment variable `name` (one of DEFAULTS), or its default when unset.

    Raises:
        UsageError: not a whole number, or outside [smallest, MAX_PROCESSES) for `name`.
    """
    text = os.environ.get(name)
    if text is None:
        return DEFAULTS[name]
    try:
        value = int(text.strip(), 10)
    except ValueError:
        value = None
    smallest = _SMALLEST[name]
    if value is None or not smallest <= value < MAX_PROCESSES:
        raise UsageError(f"the environment variable {name}={text!r} is not a whole number from {smallest} to "
                         f"{MAX_PROCESSES - 1}; torchrun sets it for each process it starts: unset it to run one "
                         "process, or launch with torchrun")
    return value


def local_rank() -> int:
    """This process's rank on its machine, torchrun's LOCAL_RANK (0 without it), checked (`check_launch`)."""
    check_launch()
    return launch_variable("LOCAL_RANK")


def launched_world_size() -> int:
    """The ranks torchrun started (WORLD_SIZE; 1 without it), known before the process group is joined, checked."""
    check_launch()
    return launch_variable("WORLD_SIZE")


def check_launch() -> None:
    """Refuse (UsageError naming the variable) a launch environment no launcher writes: each variable as
    `launch_variable` reads it, RANK below WORLD_SIZE, LOCAL_RANK below LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE at most
    WORLD_SIZE (the last two only when LOCAL_WORLD_SIZE is set: an older launcher leaves it out)."""
    values = {name: launch_variable(name) for name in DEFAULTS}
    world = values["WORLD_SIZE"]
    if values["RANK"] >= world:
        raise UsageError(f"the environment variable RANK={values['RANK']} is not below WORLD_SIZE={world}; ranks "
                         "count from 0: unset both to run one process, or launch with torchrun")
    if "LOCAL_WORLD_SIZE" in os.environ:
        local_world = values["LOCAL_WORLD_SIZE"]
        if local_world > world:
            raise UsageError(f"the environment variable LOCAL_WORLD_SIZE={local_world} is more than WORLD_SIZE="
                             f"{world}; unset both to run one process, or launch with torchrun")
        if values["LOCAL_RANK"] >= local_world:
            raise UsageError(f"the environment variable LOCAL_RANK={values['LOCAL_RANK']} is not below "
                             f"LOCAL_WORLD_SIZE={local_world}; unset both to run one process, or launch with torchrun")
