"""A run's checkpoints, of either kind, behind one interface that the loop, `--resume` and `gradcache eval` use.

- `last.pt` (`FileCheckpoint`): one file that rank 0 writes atomically (gradcache/train/checkpoints/atomic.py).
- `last.dcp` (`ShardedCheckpoint`, `--fsdp` runs): a folder of shards that every rank writes, readable on any
  number of ranks (gradcache/train/checkpoints/sharded.py).

Both hold the trained modules (`{"model": ..., "loss": ...}`), the optimizer, and the same `meta`: the run's
options (`"args"`, a RunConfig.to_dict), step, scheduler, scaler, random state, baselines, elapsed time; both
carry checksums of what they hold. Each save first renames the checkpoint it replaces to `previous.pt` (or
`previous.dcp`), so a run folder holds the newest two. `open_checkpoint` is the one resolver: given a run folder
it takes the newest checkpoint that passes its checks, falling back to the previous one with a warning naming
both; given a checkpoint itself it takes that one or refuses it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache import distributed
from gradcache.train.checkpoints.atomic import (
    is_sharded_folder,
    load_checkpoint,
    save_checkpoint,
)
from gradcache.train.checkpoints.model_state import load_saved_state, saved_state
from gradcache.train.errors import CheckpointError

DAMAGED_SUFFIX = ".damaged"  # a newest checkpoint that failed its checks, set aside when a run resumes past it


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


class FileCheckpoint(RunCheckpoint):
    """`last.pt`. It keeps only its `meta` in memory (read by `check` or `meta`); the tensors of the modules and
    the optimizer are read from the file when they are loaded, so a resume does not hold them from its checks on."""

    name, previous_name, sharded = "last.pt", "previous.pt", False

    def check(self) -> None:
        self._read()

    def meta(self) -> dict[str, Any]:
        if "_meta" not in self.__dict__:
            self._read()
        return self._meta

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        state = self._read()
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

    def _read(self) -> dict[str, Any]:
        """The whole checkpoint, checked; its meta kept, its tensors left to the caller."""
        state = load_checkpoint(self.path)
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


KINDS: dict[bool, type[RunCheckpoint]] = {False: FileCheckpoint, True: ShardedCheckpoint}


def _deepspeed_kind() -> type[RunCheckpoint]:
    from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint  # --deepspeed runs only

    return DeepSpeedCheckpoint


def checkpoint_kinds() -> tuple[type[RunCheckpoint], ...]:
    """The kinds of checkpoint a run writes (one per run: `--fsdp`, `--deepspeed` or neither), in the order a run
    folder is searched."""
    return ShardedCheckpoint, _deepspeed_kind(), FileCheckpoint


def kind_of(path: str | os.PathLike) -> type[RunCheckpoint]:
    """The kind of the checkpoint at `path`, by its name: `last.ds`/`previous.ds` (--deepspeed), a folder
    (`last.dcp`, --fsdp) or a file (`last.pt`)."""
    path = Path(path)
    if path.suffix == ".ds":
        return _deepspeed_kind()
    return KINDS[path.is_dir()]


def run_checkpoint(output_dir: str | os.PathLike, sharded: bool) -> RunCheckpoint:
    """Where a run in `output_dir` writes its checkpoint: `last.dcp` when `sharded`, else `last.pt`."""
    kind = KINDS[sharded]
    return kind(Path(output_dir) / kind.name)


@dataclass
class Found:
    """What `find_checkpoint` chose in a run folder, and the newer ones it passed over, with why."""

    chosen: RunCheckpoint | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def warn(self) -> None:
        """Say on stderr which newer checkpoint was unusable and which one is used instead (never silenced)."""
        for path, reason in self.skipped:
            print(f"gradcache: warning: the newest checkpoint {path} is unusable ({reason}); falling back to the "
                  f"previous one, {self.chosen}", file=sys.stderr)

    def set_aside(self) -> None:
        """Rename each skipped checkpoint to `<name>.damaged`, so that the next save keeps the one resumed from as
        the previous checkpoint instead of the damaged one (rank 0, after every check of the resume passed)."""
        for path, _ in self.skipped:
            if path.exists():
                os.replace(path, path.with_name(path.name + DAMAGED_SUFFIX))


def is_run_folder(path: str | os.PathLike) -> bool:
    """A folder that is not itself a checkpoint (`--resume runs/x`, as opposed to `--resume runs/x/last.dcp`)."""
    path = Path(path)
    return path.is_dir() and not is_sharded_folder(path) and path.suffix not in (".dcp", ".ds")


def run_folder_of(path: str | os.PathLike) -> Path:
    """The run folder of an existing checkpoint path, or of a run folder (itself)."""
    path = Path(path)
    return path if is_run_folder(path) else path.parent


def kind_in(folder: str | os.PathLike) -> type[RunCheckpoint] | None:
    """The one kind of checkpoint the run folder `folder` holds (None: it holds none).

    Raises:
        CheckpointError: it holds checkpoints of more than one kind, of which at most one is its run's.
    """
    folder = Path(folder)
    kinds = [kind for kind in checkpoint_kinds()
             if (folder / kind.name).exists() or (folder / kind.previous_name).exists()]
    if len(kinds) > 1:  # a run writes one kind (its --fsdp or --deepspeed): the others came from elsewhere
        names = ", ".join(name for kind in kinds for name in (kind.name, kind.previous_name)
                          if (folder / name).exists())
        raise CheckpointError(f"{folder} holds checkpoints of {len(kinds)} kinds ({names}); a run writes one kind "
                              "(last.pt, last.dcp with --fsdp, last.ds with --deepspeed), so the others were put "
                              "there from elsewhere and none is read: move away those its run did not write")
    return kinds[0] if kinds else None


def find_checkpoint(folder: str | os.PathLike) -> Found:
    """The newest checkpoint in the run folder `folder` that passes its checks (None: it holds none at all), of the
    one kind a run writes (its options name it: `--fsdp`, `--deepspeed` or neither).

    Raises:
        CheckpointError: it holds checkpoints, but none passes its checks (the message gives each one's fault), or
            checkpoints of more than one kind, of which at most one is its run's (none is read).
    """
    folder = Path(folder)
    found = Found(None)
    kind = kind_in(folder)
    if kind is None:
        return found
    newest, previous = folder / kind.name, folder / kind.previous_name
    if not newest.exists():  # a save stopped between its two renames
        found.skipped.append((newest, "it is missing: a save was interrupted"))
    for path in (p for p in (newest, previous) if p.exists()):
        try:
            candidate = kind(path)
            candidate.check()
            found.chosen = candidate
            return found
        except CheckpointError as error:
            found.skipped.append((path, str(error)))
    faults = "; ".join(f"{path.name}: {reason}" for path, reason in found.skipped)
    raise CheckpointError(f"{folder} holds no usable checkpoint ({faults}). Resume from a copy of the run "
                          "folder, or move its checkpoints away and start afresh with --resume auto")


def locate(path: str | os.PathLike) -> Found:
    """The checkpoint that `path` names: a run folder's newest good one (`find_checkpoint`), or the checkpoint
    file (`last.pt`, `previous.pt`) or folder (`last.dcp`) `path` itself, checked.

    Raises:
        CheckpointError: none there; or `path` is a checkpoint that fails its checks (a bad file is refused, not
            replaced by another); or the run folder holds no usable one.
    """
    path = Path(path)
    if is_run_folder(path):
        found = find_checkpoint(path)
        if found.chosen is None:
            names = [name for kind in checkpoint_kinds()
                     for name in (kind.name, kind.previous_name)]
            raise CheckpointError(f"{path} holds no checkpoint ({', '.join(names[:-1])} or {names[-1]}): its run "
                                  "stopped before its first save; start it afresh there with --resume auto "
                                  f"--output-dir {path}")
        return found
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist; give a checkpoint file or a run folder "
                              "holding last.pt")
    chosen = kind_of(path)(path)
    chosen.check()
    return Found(chosen)


def open_checkpoint(path: str | os.PathLike) -> RunCheckpoint:
    """`locate(path)`'s checkpoint, after warning on stderr of any newer one it fell back from."""
    found = locate(path)
    found.warn()
    return found.chosen
