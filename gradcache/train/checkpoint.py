"""Atomic checkpoints: write a temporary file in the same folder, fsync it, then `os.replace` it into place.

A crash at any point of a save leaves the previous checkpoint whole: until the rename, the old file is untouched,
and the rename itself is atomic on POSIX and Windows within one file system. A checkpoint is a plain dict of
tensors, numbers, strings and containers, so it loads with `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch


EXTRA_FILE = "extra.pt"  # in a sharded checkpoint folder: rank 0's step, run options and random state


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or does not belong to the run that tries to resume from it."""


def sharded_folder(path: str | os.PathLike) -> Path | None:
    """The folder to read the sharded checkpoint `path` from: `path` itself or, where a save stopped between its
    two renames (see `gradcache.train.fsdp.save_sharded`), its `.old` copy; None where neither holds one."""
    path = Path(path)
    for folder in (path, path.with_name(path.name + ".old")):
        if (folder / ".metadata").is_file() and (folder / EXTRA_FILE).is_file():
            return folder
    return None


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically; a failure leaves `path` as it was and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)  # make the rename itself durable
    return path


def _fsync_directory(folder: Path) -> None:
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run folder's `last.pt`."""
    path = Path(path)
    if path.is_dir():
        path = path / "last.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist; give a checkpoint file or a run folder "
                              "holding last.pt")
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (a file, or a run folder's `last.pt`)."""
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several unrelated types for a corrupt or foreign file
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {error}") from error
    if not isinstance(state, dict) or "args" not in state or "model" not in state:
        raise CheckpointError(f"{str(path)!r} is not a gradcache training checkpoint (no 'args' or 'model')")
    return state


def capture_random_state() -> dict[str, Any]:
    """Every generator a training step may draw from: torch CPU, each CUDA device, and Python's `random`."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_random_state(state: dict[str, Any]) -> None:
    """Put back what `capture_random_state` recorded (CUDA states only where CUDA is present)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
