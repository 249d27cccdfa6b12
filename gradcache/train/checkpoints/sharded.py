"""Sharded checkpoints (`last.dcp`) of `--fsdp` runs: torch.distributed.checkpoint folders that resume on any
number of ranks, with a sha256 of every shard file and the same atomic replace as single-file checkpoints. As a
`last.pt`, they leave the frozen parameters out (LoRA's base weights: checkpoints/model_state.py): the model's
trained parameters, its buffers, and the optimizer state of the trained parameters, which is all it has."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from gradcache import distributed
from gradcache.train.checkpoints.atomic import (
    EXTRA_FILE,
    folder_bytes,
    is_sharded_folder,
    read_checked,
    rotate_into_place,
    save_checkpoint,
    tensor_bytes,
)
from gradcache.train.checkpoints.checksum import files_sha256
from gradcache.train.checkpoints.model_state import frozen_names
from gradcache.train.checkpoints.regular_files import PrivateCopy, regular_files
from gradcache.train.checkpoints.sharded_metadata import METADATA_FILE, ScreenedReader, read_metadata
from gradcache.train.errors import CheckpointError, DiskFull, out_of_space

FILES_KEY = "files"  # in extra.pt: sha256 of every other file of the folder, checked by check_sharded_files
# the frozen parameters are neither written nor read: the model was built with them (checkpoints/model_state.py);
# loading is not strict about them alone (_check_loaded)
SAVED = StateDictOptions(ignore_frozen_params=True)
LOADED = StateDictOptions(ignore_frozen_params=True, strict=False)


def save_sharded(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any] | None = None, previous: str | os.PathLike | None = None) -> Path:
    """Every rank writes its shards of `model` and `optimizer` to `folder` (torch.distributed.checkpoint).

    `model` holds everything trained (encoders and loss, e.g. an `nn.ModuleDict`); `optimizer` steps exactly
    its parameters. Keys are parameter names, not ranks, so `load_sharded` reads it on any number of ranks,
    one process without a process group included. `extra` (step, arguments, scheduler; rank 0's copy is written,
    with the saving `world_size` and the sha256 of every shard file, to `extra.pt` beside the shards) must load
    with `weights_only=True`. The shards go to `<folder>.partial`, which rank 0 then renames into place, first
    renaming the folder it replaces to `previous` (when given; else that one is deleted), so a crash mid-save
    leaves a whole checkpoint. Call on every rank, with a folder every rank can reach.

    Raises:
        DiskFull: no space left for the shards (on any rank); the partial folder is removed.
    """
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    replaced = Path(previous) if previous is not None else folder.with_name(folder.name + ".old")
    grouped = distributed.is_distributed()
    leader = distributed.rank() == 0
    if leader:
        shutil.rmtree(partial, ignore_errors=True)  # what a crashed save left
    if grouped:
        dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=SAVED)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial), no_dist=not grouped)
        if leader:
            files = files_sha256(partial)
            save_checkpoint({**(extra or {}), "world_size": distributed.world_size(), FILES_KEY: files},
                            partial / EXTRA_FILE)
    except Exception as error:
        needed = max(folder_bytes(partial), folder_bytes(folder), tensor_bytes([model_state, optimizer_state]))
        full = isinstance(error, DiskFull) or out_of_space(error, folder.parent, needed)  # before the partial goes
        if leader:
            shutil.rmtree(partial, ignore_errors=True)
        if full:
            raise DiskFull(folder.parent, needed, shutil.disk_usage(folder.parent).free,
                           resumable=folder.exists() or replaced.exists()) from error
        raise
    if leader:
        try:
            if folder.exists():  # until the last rename the run folder's resolver reads `previous`
                rotate_into_place(partial, folder, replaced)
            else:
                os.replace(partial, folder)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # `folder` and `previous` are as they were
            raise
        if previous is None:
            shutil.rmtree(replaced, ignore_errors=True)
    if grouped:
        dist.barrier()  # nobody reads the folder before it is whole
    return folder


class ScreenedShards:
    """A sharded checkpoint read once: every file copied into a folder this process alone can write, hashed as it is
    copied (checkpoints/regular_files.py: no link, nothing but regular files), `extra.pt` checked, each file it
    lists compared with its sha256, and `.metadata` read without pickle running it (checkpoints/sharded_metadata.py).
    `dcp.load` then reads the copy through `reader()`: nothing is read from the run folder after the checks, so a
    file renamed over a shard then is never loaded. Folders written before the shards' sha256 were kept are checked
    for `extra.pt` and `.metadata` alone. `close` removes the copy (so does collection)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = _resolve_sharded(Path(folder))
        present = regular_files(self.folder, self.folder)
        self.copy = PrivateCopy(self.folder)
        try:
            self.copy.add(self.folder, [EXTRA_FILE])
            with open(self.copy.folder / EXTRA_FILE, "rb") as handle:  # named as the run's file in errors
                self.extra = read_checked(self.folder / EXTRA_FILE, handle)
            expected = self.extra.get(FILES_KEY)
            if expected is not None and not (isinstance(expected, dict) and all(
                    isinstance(name, str) and "/" not in name and name not in (".", "..", EXTRA_FILE)
                    for name in expected)):
                raise CheckpointError(f"sharded checkpoint {str(self.folder)!r}: its {EXTRA_FILE} lists no files a "
                                      "save writes; it was altered")
            names = sorted(expected) if expected is not None else [n for n in present if n != EXTRA_FILE]
            for name in names:
                if name not in present:
                    raise CheckpointError(f"sharded checkpoint {str(self.folder)!r} lacks its file {name}")
            self.copy.add(self.folder, names)
            for name, digest in (expected or {}).items():
                if self.copy.sha256[name] != digest:
                    raise CheckpointError(f"sharded checkpoint {str(self.folder)!r}: {name} fails its checksum "
                                          "(truncated, or changed after it was written)")
            if METADATA_FILE not in names:
                raise CheckpointError(f"sharded checkpoint {str(self.folder)!r} lacks its file {METADATA_FILE}")
            self.metadata = read_metadata((self.copy.folder / METADATA_FILE).read_bytes(), str(self.folder),
                                          set(names) - {METADATA_FILE})
        except BaseException:
            self.copy.close()
            raise

    def reader(self) -> ScreenedReader:
        """What `dcp.load` reads: the copy, with the screened metadata."""
        return ScreenedReader(self.copy.folder, self.metadata)

    def close(self) -> None:
        self.copy.close()


def check_sharded_files(folder: str | os.PathLike, screened: ScreenedShards | None = None) -> ScreenedShards:
    """`folder` read and checked once (`ScreenedShards`): a whole sharded checkpoint, `extra.pt` passes its
    checksum, every shard file named in it is there with the sha256 it was written with, and `.metadata` holds
    what torch writes alone. Returns the checked copy (`screened`, if given, is returned as it is).

    Raises:
        CheckpointError: any of that fails; nothing of the folder ran.
    """
    return screened if screened is not None else ScreenedShards(folder)


def sharded_extra(folder: str | os.PathLike, screened: ScreenedShards | None = None) -> dict[str, Any]:
    """The `extra` of a `save_sharded` folder, without a model: what `--resume` needs to rebuild the run."""
    if screened is None:
        screened = ScreenedShards(folder)
        try:
            return _extra(screened)
        finally:
            screened.close()
    return _extra(screened)


def load_sharded(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                 screened: ScreenedShards | None = None) -> dict[str, Any]:
    """Read a `save_sharded` folder into `model` and `optimizer` (sharded or not, any number of ranks) and
    return its `extra` (with the `world_size` that saved it). Call on every rank, after sharding and after
    building the optimizer. Given `screened` (the folder, checked once before), it is read from there.

    Raises:
        CheckpointError: `folder` is not a sharded checkpoint, fails its checks, or does not hold `model`'s
            parameters.
    """
    screened = screened or ScreenedShards(folder)
    try:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=SAVED)
        state = _read(screened, {"model": model_state, "optimizer": optimizer_state})
        _check_loaded(model, set_state_dict(model, optimizer, model_state_dict=state["model"],
                                            optim_state_dict=state["optimizer"], options=LOADED))
        return _extra(screened)
    finally:
        screened.close()


def load_sharded_model(folder: str | os.PathLike, model: nn.Module,
                       screened: ScreenedShards | None = None) -> dict[str, Any]:
    """Read only the model of a `save_sharded` folder into `model` (sharded or a plain module in one process,
    as `gradcache eval` needs) and return its `extra`; the optimizer state stays on disk.

    Raises:
        CheckpointError: `folder` is not a sharded checkpoint, fails its checks, or does not hold `model`'s
            parameters.
    """
    screened = screened or ScreenedShards(folder)
    try:
        state = _read(screened, {"model": get_model_state_dict(model, options=SAVED)})
        _check_loaded(model, set_model_state_dict(model, state["model"], options=LOADED))
        return _extra(screened)
    finally:
        screened.close()


def _check_loaded(model: nn.Module, result: Any) -> None:
    """What a load left out, but the frozen parameters, is a bug here (`_read` checked the folder's keys)."""
    frozen = frozen_names(model)
    left = [key for key in result.missing_keys if key not in frozen]
    if left or result.unexpected_keys:
        raise RuntimeError(f"the sharded model state does not fit: lacks {left[:5]}, has unknown "
                           f"{result.unexpected_keys[:5]}")


def _check_holds(folder: Path, stored: dict[str, Any], model_state: dict[str, Any]) -> None:
    missing = sorted(k for k in model_state if f"model.{k}" not in stored)
    if missing:
        raise CheckpointError(f"{str(folder)!r} does not hold parameters {missing[:5]}"
                              f"{' and more' if len(missing) > 5 else ''}: it was saved from another model")
    for key, value in model_state.items():
        size = getattr(stored[f"model.{key}"], "size", None)  # tensors carry their global size, other entries none
        if isinstance(value, torch.Tensor) and size is not None and tuple(size) != tuple(value.shape):
            raise CheckpointError(f"{str(folder)!r} holds {key} of shape {tuple(size)}, the model has "
                                  f"{tuple(value.shape)}: it was saved from another model")


def _read(screened: ScreenedShards, state: dict[str, Any]) -> dict[str, Any]:
    """Fill `state` (its "model" entry a model state dict) in place from the screened copy, after checking that the
    folder holds every parameter of that model."""
    _check_holds(screened.folder, screened.metadata.state_dict_metadata, state["model"])
    dcp.load(state, storage_reader=screened.reader(), no_dist=not distributed.is_distributed())
    return state


def _extra(screened: ScreenedShards) -> dict[str, Any]:
    """`extra.pt` as the caller of save_sharded gave it (with `world_size`), checked, without the shard checksums."""
    return {k: v for k, v in screened.extra.items() if k != FILES_KEY}


def _resolve_sharded(folder: Path) -> Path:
    """`folder`, if it is a sharded checkpoint (choosing between `last.dcp` and `previous.dcp` is
    `gradcache.train.checkpoints.run_checkpoint`'s)."""
    if folder.is_symlink() or not is_sharded_folder(folder):
        hint = (" it is a single-file checkpoint: resume without --fsdp" if folder.is_file()
                else " give the folder that save_sharded wrote (it holds .metadata and extra.pt), not a link")
        raise CheckpointError(f"{str(folder)!r} is not a sharded (torch.distributed.checkpoint) checkpoint;{hint}")
    return folder
