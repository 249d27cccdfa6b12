"""`last.dcp` (`ShardedCheckpoint`, `--fsdp` runs): a folder of shards that every rank writes, readable on any
number of ranks (gradcache/train/checkpoints/sharded.py, imported for these runs alone)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradcache.train.checkpoints.interface import RunCheckpoint
from gradcache.train.errors import CheckpointError


class ShardedCheckpoint(RunCheckpoint):
    """`last.dcp`. Its files are read once, by its first check, into a private copy that its load then reads
    (checkpoints/sharded.py, `ScreenedShards`); the load removes the copy."""

    name, previous_name, sharded = "last.dcp", "previous.dcp", True

    def check(self) -> None:
        self._screened()

    def meta(self) -> dict[str, Any]:
        from gradcache.train.checkpoints.sharded import sharded_extra

        meta = sharded_extra(self.path, self._screened())
        if "args" not in meta:
            raise CheckpointError(f"{self.path} is a sharded checkpoint without the run's options; it was not "
                                  "written by gradcache train")
        return meta

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        from gradcache.train.checkpoints.sharded import load_sharded, load_sharded_model

        screened = self.__dict__.pop("_checked", None)  # removed by the load
        if optimizer is None:
            load_sharded_model(self.path, trained, screened)
        else:
            load_sharded(self.path, trained, optimizer, screened)

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        from gradcache.train.checkpoints.sharded import save_sharded

        save_sharded(self.path, trained, optimizer, extra=meta, previous=self.previous_path)  # every rank writes
        checked = self.__dict__.pop("_checked", None)
        if checked is not None:
            checked.close()

    def _screened(self) -> Any:
        """The checkpoint's files as its first check read them (`ScreenedShards`)."""
        if "_checked" not in self.__dict__:
            from gradcache.train.checkpoints.sharded import ScreenedShards  # torch.distributed.checkpoint: these runs

            self._checked = ScreenedShards(self.path)
        return self._checked
