"""What a checkpoint holds beside the tensors of the model, the loss and the optimizer: one typed, versioned
record, written by `Run.save` and read by `--resume`, `Run._resume` and `gradcache eval` through this module
alone (a checkpoint of either kind stores it as plain values: `to_dict` / `from_dict`).

Versions: 0 is every checkpoint written before the record had a version of its own (it may lack `initial`,
the step-0 metrics, which the first versions did not keep, and carries a `signature` entry that nothing
read); 1 adds `meta_version`. The run's options inside are versioned apart (`RunConfig`, `config_version`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError

META_VERSION = 1


def entry(key: str | None = None, older: Callable[[], Any] | None = None,
           to_plain: Callable[[Any], Any] | None = None, from_plain: Callable[[Any], Any] | None = None) -> dict:
    """A field's metadata: its key in the checkpoint (default: its name), what a checkpoint without it reads as
    (`older()`; None: required), and how its value becomes plain values and back (default: as it is)."""
    return {"key": key, "older": older, "to_plain": to_plain, "from_plain": from_plain}


@dataclass
class CheckpointMeta:
    """Where a run stood when it saved: enough, with the tensors, to continue as if it had not stopped. Each field
    is listed once, here: `to_dict` and `from_dict` read the list, and its `entry(...)` metadata."""

    config: RunConfig = field(metadata=entry("args", to_plain=RunConfig.to_dict,  # the run's options
                                              from_plain=RunConfig.from_dict))
    step: int  # optimizer steps taken
    total_steps: int  # the run's length when it saved (a resume may lengthen it)
    # the data position of `step`: epoch and batch within it (a function of step, kept to read)
    epoch: int = field(metadata=entry(older=lambda: 0))
    batch_in_epoch: int = field(metadata=entry(older=lambda: 0))
    scheduler: dict[str, Any]  # the learning-rate scheduler's state_dict
    scaler: dict[str, Any]  # the gradient scaler's state_dict
    random_state: dict[str, Any]  # every generator the run draws from (checkpoints/atomic.py)
    elapsed_s: float  # training time before the save
    baselines: dict[str, float] = field(default_factory=dict)  # the mode's baselines (metrics.json)
    initial: dict[str, float] = field(default_factory=dict, metadata=entry(older=dict))  # held-out metrics, step 0

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint file (or a sharded checkpoint's extra.pt)."""
        plain = {"meta_version": META_VERSION}
        for record in fields(self):
            write = record.metadata.get("to_plain") or (lambda value: value)
            plain[_key(record)] = write(getattr(self, record.name))
        return plain

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
        missing = [_key(record) for record in fields(cls)
                   if _key(record) not in stored and record.metadata.get("older") is None]
        if missing:
            raise CheckpointError(f"{source} lacks {missing}; it was not written by gradcache train")
        values = {}
        for record in fields(cls):
            if _key(record) not in stored:
                values[record.name] = record.metadata["older"]()
                continue
            read = record.metadata.get("from_plain") or (lambda value: value)
            values[record.name] = read(stored[_key(record)])
        return cls(**values)


def _key(record: Any) -> str:
    return record.metadata.get("key") or record.name
