"""A run's checkpoint, of either kind, behind one interface that the loop, `--resume` and `gradcache eval` use.

- `last.pt` (`FileCheckpoint`): one file that rank 0 writes atomically (gradcache/train/checkpoint.py).
- `last.dcp` (`ShardedCheckpoint`, `--fsdp` runs): a folder of shards that every rank writes, readable on any
  number of ranks (gradcache/train/fsdp.py).

Both hold the trained modules (`{"model": ..., "loss": ...}`), the optimizer, and the same `meta`: the run's
options (`"args"`, a RunConfig.to_dict), step, scheduler, scaler, random state, baselines, elapsed time.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache import distributed
from gradcache.train.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint, sharded_folder


class RunCheckpoint:
    """The checkpoint at `path` (which may not exist yet)."""

    name: str  # the file or folder name in a run folder
    sharded: bool

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return str(self.path)

    def meta(self) -> dict[str, Any]:
        """Everything but the tensors of the modules and the optimizer; the run's options under "args"."""
        raise NotImplementedError

    def check_fits(self, trained: nn.ModuleDict) -> None:
        """Raise CheckpointError unless the checkpoint holds `trained`'s parameters (reads, writes nothing)."""
        raise NotImplementedError

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Put the saved tensors into `trained` (and `optimizer`, when given)."""
        raise NotImplementedError

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        """Write atomically: a crash at any point leaves the previous checkpoint whole. Call on every rank."""
        raise NotImplementedError


class FileCheckpoint(RunCheckpoint):
    name, sharded = "last.pt", False

    def meta(self) -> dict[str, Any]:
        return {k: v for k, v in self._state().items() if k not in ("model", "loss", "optimizer")}

    def check_fits(self, trained: nn.ModuleDict) -> None:
        try:
            trained["model"].load_state_dict(self._state()["model"])
        except (RuntimeError, KeyError, ValueError, TypeError) as error:
            raise CheckpointError(f"--resume {self.path} does not fit the model it names: {error}") from error

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        state = self._state()
        trained["model"].load_state_dict(state["model"])
        trained["loss"].load_state_dict(state["loss"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        self.__dict__.pop("_loaded", None)  # the modules hold the tensors now

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        if distributed.rank() == 0:  # the ranks hold the same replicas
            save_checkpoint({**meta, "model": trained["model"].state_dict(), "loss": trained["loss"].state_dict(),
                             "optimizer": optimizer.state_dict()}, self.path)
        self.__dict__.pop("_loaded", None)

    def _state(self) -> dict[str, Any]:
        if "_loaded" not in self.__dict__:
            self._loaded = load_checkpoint(self.path)
        return self._loaded


class ShardedCheckpoint(RunCheckpoint):
    name, sharded = "last.dcp", True

    def meta(self) -> dict[str, Any]:
        from gradcache.train.fsdp import sharded_extra  # torch.distributed.checkpoint: only for these runs

        meta = sharded_extra(self.path)
        if "args" not in meta:
            raise CheckpointError(f"{self.path} is a sharded checkpoint without the run's options; it was not "
                                  "written by gradcache train")
        return meta

    def check_fits(self, trained: nn.ModuleDict) -> None:
        from gradcache.train.fsdp import check_sharded_model

        check_sharded_model(self.path, trained)

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        from gradcache.train.fsdp import load_sharded, load_sharded_model

        if optimizer is None:
            load_sharded_model(self.path, trained)
        else:
            load_sharded(self.path, trained, optimizer)

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        from gradcache.train.fsdp import save_sharded

        save_sharded(self.path, trained, optimizer, extra=meta)  # every rank writes its shards


KINDS: dict[bool, type[RunCheckpoint]] = {False: FileCheckpoint, True: ShardedCheckpoint}


def run_checkpoint(output_dir: str | os.PathLike, sharded: bool) -> RunCheckpoint:
    """Where a run in `output_dir` keeps its checkpoint: `last.dcp` when `sharded`, else `last.pt`."""
    kind = KINDS[sharded]
    return kind(Path(output_dir) / kind.name)


def open_checkpoint(path: str | os.PathLike) -> RunCheckpoint:
    """The checkpoint that `path` names: a `last.pt` file, a `last.dcp` folder, or a run folder holding either.

    Raises:
        CheckpointError: there is none at `path`.
    """
    path = Path(path)
    for folder in (path, path / ShardedCheckpoint.name):
        if sharded_folder(folder) is not None:
            return ShardedCheckpoint(folder)
    return FileCheckpoint(resolve_checkpoint(path))
