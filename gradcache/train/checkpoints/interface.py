"""`RunCheckpoint`: the interface every kind of a run's checkpoint implements (`last.pt`: file_checkpoint.py,
`last.dcp`: sharded_checkpoint.py, `last.ds`: deepspeed_checkpoint.py), which the loop, `--resume` and the commands
use; which one a run folder holds, and the fallback to the previous one, is the resolver's (run_checkpoint.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn


class RunCheckpoint:
    """The checkpoint at `path` (which may not exist yet)."""

    name: str  # the newest checkpoint's file or folder name in a run folder
    previous_name: str  # the one before it
    sharded: bool

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return str(self.path)

    def check(self) -> None:
        """Raise CheckpointError unless the checkpoint is whole: readable, and its contents match its checksums."""
        raise NotImplementedError

    def meta(self) -> dict[str, Any]:
        """Everything but the tensors of the modules and the optimizer; the run's options under "args"."""
        raise NotImplementedError

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Put the saved tensors into `trained` (and `optimizer`, when given).

        Raises:
            CheckpointError: the checkpoint does not hold `trained`'s parameters (another model); raised before
                any tensor is copied.
        """
        raise NotImplementedError

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        """Write atomically, the replaced checkpoint kept as the previous one: a crash at any point leaves a
        loadable checkpoint. Call on every rank.

        Raises:
            DiskFull: no space for it; the folder keeps what it held.
        """
        raise NotImplementedError

    @property
    def previous_path(self) -> Path:
        return self.path.with_name(self.previous_name)
