"""`last.pt` (`FileCheckpoint`): one file that rank 0 writes atomically (gradcache/train/checkpoints/atomic.py),
holding the trained modules, the optimizer and the run's `meta`, with its checksum."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache import distributed
from gradcache.train.checkpoints.atomic import load_checkpoint, save_checkpoint
from gradcache.train.checkpoints.interface import RunCheckpoint
from gradcache.train.checkpoints.model_state import load_saved_state, saved_state
from gradcache.train.checkpoints.regular_files import open_regular
from gradcache.train.errors import CheckpointError


class FileCheckpoint(RunCheckpoint):
    """`last.pt`. It keeps only its `meta` in memory (read by `check` or `meta`); the tensors of the modules and
    the optimizer are read from the file when they are loaded, so a resume does not hold them from its checks on.
    The file is opened once, at the first read, and every read after goes through that descriptor: a file renamed
    over `last.pt` after its check is never the one loaded (checkpoints/regular_files.py)."""

    name, previous_name, sharded = "last.pt", "previous.pt", False

    def check(self) -> None:
        self._read()

    def meta(self) -> dict[str, Any]:
        if "_meta" not in self.__dict__:
            self._read()
        return self._meta

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        try:
            state = self._read()
        finally:
            self._release()  # read: nothing more is read from the file
        _check_holds(self.path, state, trained)  # before any tensor is copied
        load_saved_state(trained["model"], state["model"])
        trained["loss"].load_state_dict(state["loss"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        if distributed.rank() == 0:  # the ranks hold the same replicas
            save_checkpoint({**meta, "model": saved_state(trained["model"]), "loss": trained["loss"].state_dict(),
                             "optimizer": optimizer.state_dict()}, self.path, previous=self.previous_path)
        self.__dict__.pop("_meta", None)
        self._release()  # the file it read is now previous.pt

    def _release(self) -> None:
        """Close the file the reads went through (the next read opens `path` anew)."""
        handle = self.__dict__.pop("_handle", None)
        if handle is not None:
            handle.close()

    def _read(self) -> dict[str, Any]:
        """The whole checkpoint, checked; its meta kept, its tensors left to the caller."""
        if "_handle" not in self.__dict__:
            self._handle = open_regular(self.path / self.name if self.path.is_dir() else self.path)
        try:
            state = load_checkpoint(self.path, self._handle)
        except BaseException:
            self._release()  # a bad checkpoint is not read again
            raise
        self._meta = {k: v for k, v in state.items() if k not in TENSOR_ENTRIES}
        return state


TENSOR_ENTRIES = ("model", "loss", "optimizer")  # what a `last.pt` holds beside its meta


def _check_holds(path: Path, state: dict[str, Any], trained: nn.ModuleDict) -> None:
    """Raise CheckpointError unless `state` holds the tensors of `trained`'s model (each in its shape; its frozen
    parameters left out: checkpoints/model_state.py) and loss, and no others: `load_state_dict` would refuse it too,
    but only after copying what did fit, and with a RuntimeError. The loss's shapes are its own to adopt (a queue is
    sized on its first step)."""
    for part in ("model", "loss"):
        expected = saved_state(trained[part]) if part == "model" else trained[part].state_dict()
        stored = state.get(part, {})
        faults = [(what, names) for what, names in (
            ("lacks", sorted(set(expected) - set(stored))), ("has unknown", sorted(set(stored) - set(expected))),
            ("has other shapes for", [f"{key} {tuple(stored[key].shape)} (the model's: {tuple(value.shape)})"
                                      for key, value in expected.items() if part == "model" and key in stored
                                      and isinstance(value, torch.Tensor) and stored[key].shape != value.shape]))
            if names]
        if faults:
            found = "; ".join(f"{what} {names[:5]}{' and more' if len(names) > 5 else ''}" for what, names in faults)
            raise CheckpointError(f"checkpoint {path} does not fit the {part} its run's options build: it {found}; "
                                  "it was saved from another model or by another version of the program")
