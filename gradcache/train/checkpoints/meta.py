"""What a checkpoint holds beside the tensors of the model, the loss and the optimizer: one typed, versioned
record, written by `Run.save` and read by `--resume`, `Run._resume` and `gradcache eval` through this module
alone (a checkpoint of either kind stores it as plain values: `to_dict` / `from_dict`).

Versions: 0 is every checkpoint written before the record had a version of its own (it may lack `initial`,
the step-0 metrics, which the first versions did not keep, and carries a `signature` entry that nothing
read); 1 adds `meta_version`. The run's options inside are versioned apart (`RunConfig`, `config_version`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError

META_VERSION = 1


@dataclass
class CheckpointMeta:
    """Where a run stood when it saved: enough, with the tensors, to continue as if it had not stopped."""

    config: RunConfig  # the run's options (stored under "args")
    step: int  # optimizer steps taken
    total_steps: int  # the run's length when it saved (a resume may lengthen it)
    epoch: int  # the data position of `step`: epoch and batch within it (a function of step, kept to read)
    batch_in_epoch: int
    scheduler: dict[str, Any]  # the learning-rate scheduler's state_dict
    scaler: dict[str, Any]  # the gradient scaler's state_dict
    random_state: dict[str, Any]  # every generator the run draws from (checkpoints/atomic.py)
    elapsed_s: float  # training time before the save
    baselines: dict[str, float] = field(default_factory=dict)  # the mode's baselines (metrics.json)
    initial: dict[str, float] = field(default_factory=dict)  # the held-out metrics at step 0

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint file (or a sharded checkpoint's extra.pt)."""
        return {"meta_version": META_VERSION, "args": self.config.to_dict(), "step": self.step,
                "total_steps": self.total_steps, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "scheduler": self.scheduler, "scaler": self.scaler, "random_state": self.random_state,
                "elapsed_s": self.elapsed_s, "baselines": self.baselines, "initial": self.initial}

    @classmethod
    def from_dict(cls, stored: dict[str, Any], source: object = "the checkpoint") -> CheckpointMeta:
        """The record a checkpoint stored, of this or any older version.

        Raises:
            CheckpointError: a newer version than this program reads, or an entry missing (not written by
                gradcache train).
        """
        version = stored.get("meta_version", 0)
        if version > META_VERSION:
            raise CheckpointError(f"{source} was written by a newer gradcache (checkpoint version {version}; this "
                                  f"one reads up to {META_VERSION}); upgrade gradcache to read it")
        required = ("args", "step", "total_steps", "scheduler", "scaler", "random_state", "elapsed_s", "baselines")
        missing = [key for key in required if key not in stored]
        if missing:
            raise CheckpointError(f"{source} lacks {missing}; it was not written by gradcache train")
        return cls(config=RunConfig.from_dict(stored["args"]), step=stored["step"],
                   total_steps=stored["total_steps"], epoch=stored.get("epoch", 0),
                   batch_in_epoch=stored.get("batch_in_epoch", 0), scheduler=stored["scheduler"],
                   scaler=stored["scaler"], random_state=stored["random_state"], elapsed_s=stored["elapsed_s"],
                   baselines=stored["baselines"], initial=stored.get("initial", {}))
