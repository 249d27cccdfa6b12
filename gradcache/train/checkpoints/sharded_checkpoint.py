"""`last.dcp` (`ShardedCheckpoint`, `--fsdp` runs): a folder of shards that every rank writes, readable on any
number of ranks (gradcache/train/checkpoints/sharded.py, imported for these runs alone)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradcache.train.checkpoints.interface import RunCheckpoint
from gradcache.train.errors import CheckpointError


class ShardedCheckpoint(RunCheckpoint):
    name, previous_name, sharded = "last.dcp", "previous.dcp", True

    def check(self) -> None:
        from gradcache.train.checkpoints.sharded import (
            check_sharded_files,  # torch.distributed.checkpoint: only for these runs
        )

        check_sharded_files(self.path)

    def meta(self) -> dict[str, Any]:
        from gradcache.train.checkpoints.sharded import sharded_extra

        meta = sharded_extra(self.path)
        if "args" not in meta:
            raise CheckpointError(f"{self.path} is a sharded checkpoint without the run's options; it was not "
                                  "written by gradcache train")
        return meta

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        from gradcache.train.checkpoints.sharded import load_sharded, load_sharded_model

        if optimizer is None:
            load_sharded_model(self.path, trained)
        else:
            load_sharded(self.path, trained, optimizer)

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        from gradcache.train.checkpoints.sharded import save_sharded

        save_sharded(self.path, trained, optimizer, extra=meta, previous=self.previous_path)  # every rank writes
