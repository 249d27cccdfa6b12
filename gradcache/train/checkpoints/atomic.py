"""Atomic checkpoints that carry their own checksum, with the previous one kept beside the newest.

A save writes a temporary file in the same folder, fsyncs it, then renames it into place (`os.replace`): a crash
at any point leaves the previous checkpoint whole, since until the rename the old file is untouched and the
rename itself is atomic within one file system. Given `previous=`, the file being replaced is first renamed
there, so a run folder holds `last.pt` and `previous.pt`. A checkpoint is a plain dict of tensors, numbers,
strings and containers, loaded with `torch.load(weights_only=True)` (a file from elsewhere never runs code),
plus `CHECKSUM_KEY`: the sha256 of the rest (gradcache/train/checkpoints/checksum.py), checked on every load, after
the loaded objects were bounded (gradcache/train/checkpoints/state_bounds.py); the file is opened once and read
through that descriptor, never through a link (gradcache/train/checkpoints/regular_files.py).
"""
from __future__ import annotations

import os
import pickle
import random
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from gradcache import distributed
from gradcache.train.checkpoints.checksum import CHECKSUM_KEY, CHECKSUM_VERSION, VERSION_KEY, content_sha256
from gradcache.train.checkpoints.regular_files import open_regular
from gradcache.train.checkpoints.state_bounds import bounds_fault
from gradcache.train.errors import CheckpointError, DiskFull, out_of_space
from gradcache.train.run_folder.permissions import as_if_created

EXTRA_FILE = "extra.pt"  # in a sharded checkpoint folder: rank 0's step, run options and random state
RANKS_KEY = "ranks"  # in a random state: each rank's generators, in rank order (capture_random_state)


def is_sharded_folder(path: str | os.PathLike) -> bool:
    """A folder written by `gradcache.train.checkpoints.sharded.save_sharded`: shards, `.metadata` and `EXTRA_FILE`."""
    path = Path(path)
    return (path / ".metadata").is_file() and (path / EXTRA_FILE).is_file()


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike, previous: str | os.PathLike | None = None) -> Path:
    """Write `state` with its checksum to `path` atomically, first renaming an existing `path` to `previous`
    (when given). A failure leaves both as they were and no temporary file behind: where the new file cannot be
    renamed into place after `path` went to `previous`, `previous` is renamed back to `path`, and the file that
    `previous` held is restored from where it was set aside.

    Raises:
        DiskFull: the file system ran out of space (or quota), whatever error a write's ENOSPC became in torch
            (gradcache.train.errors.out_of_space); it names the folder and the space needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {**state, CHECKSUM_KEY: content_sha256(state), VERSION_KEY: CHECKSUM_VERSION}
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        as_if_created(handle.name)  # tempfile made it 0600; the run's other files are 0644 under umask 022
        if previous is not None and path.exists():
            rotate_into_place(Path(handle.name), path, Path(previous))
        else:
            os.replace(handle.name, path)
    except Exception as error:
        full = out_of_space(error, path.parent, _size_needed(state, path))  # before the partial file goes
        Path(handle.name).unlink(missing_ok=True)
        if full:
            raise DiskFull(path.parent, _size_needed(state, path), shutil.disk_usage(path.parent).free) from error
        raise
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)  # make the renames themselves durable
    return path


def rotate_into_place(new: Path, path: Path, previous: Path) -> None:
    """previous -> aside, path -> previous, new -> path (files, or the folders of a sharded checkpoint); a failed
    rename undoes the ones before it, so `path` and `previous` are as they were. A crash between the renames
    leaves the newest checkpoint whole, as `path` or, once that has moved, as `previous` (which the resolver reads
    when `path` is missing); what was set aside is then a stale temporary, removed by the next job
    (gradcache/train/run_folder/lock.py)."""
    aside = None
    if previous.exists():  # kept until the new file is in place: a failed save must not cost the older checkpoint
        aside = previous.with_name(f".{previous.name}.aside.tmp")  # one job per folder: one name will do
        os.replace(previous, aside)
    try:
        os.replace(path, previous)  # a crash before the next rename leaves previous alone: it is read then
        try:
            os.replace(new, path)
        except BaseException:
            os.replace(previous, path)
            raise
    except BaseException:
        if aside is not None:
            os.replace(aside, previous)
        raise
    if aside is not None:
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()


def _size_needed(state: dict[str, Any], path: Path) -> int:
    """The bytes of the tensors being saved, or the size of the checkpoint already there if larger."""
    return max(tensor_bytes(state), path.stat().st_size if path.is_file() else 0)


def tensor_bytes(state: Any) -> int:
    """The bytes of every tensor in `state` (nested dicts, lists and tuples): what a save of it writes, about.
    A sharded tensor counts whole, as the checkpoint of every rank's shards holds it."""
    total, stack = 0, [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


def folder_bytes(folder: Path) -> int:
    """The bytes of the files in `folder` and its subfolders (0: there is none)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _fsync_directory(folder: Path) -> None:
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_checked(path: str | os.PathLike, handle: BinaryIO | None = None) -> dict[str, Any]:
    """The dict in the file `path`, after checking its checksum (files written before checksums have none): the
    file is opened once, not through a link (checkpoints/regular_files.py), and what is checked is what is
    returned. Given `handle` (the file, opened so before), it is read from there instead, from its start.

    Raises:
        CheckpointError: missing, a link or no regular file, unreadable, not a dict, more than a state dict can be
            (checkpoints/state_bounds.py: a cycle, deeper or larger than any, a tensor reaching past its
            storage), or its contents differ from its checksum.
    """
    path = Path(path)
    if handle is None:
        with open_regular(path) as opened:
            return read_checked(path, opened)
    handle.seek(0)
    try:
        state = torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # what the weights-only unpickler refuses: code, or damaged bytes
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: it holds something other than tensors and "
                              f"plain values ({_refused(error)}); gradcache train never writes that, so the file is "
                              "damaged or was not written by it. It was refused without running any of it; resume "
                              "from another checkpoint (previous.pt) or start afresh") from None
    except Exception as error:  # torch raises several unrelated types for a corrupt or foreign file
        raise CheckpointError(f"cannot read checkpoint {str(path)!r} (truncated or damaged?): "
                              f"{str(error).splitlines()[0][:300] if str(error) else type(error).__name__}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{str(path)!r} is not a gradcache checkpoint (it holds a {type(state).__name__})")
    version = state.pop(VERSION_KEY, 1)
    if version not in (1, CHECKSUM_VERSION):
        raise CheckpointError(f"checkpoint {str(path)!r} carries a checksum of version {version!r}; this program "
                              f"reads versions 1 and {CHECKSUM_VERSION} (a newer gradcache wrote it, or the file was "
                              "edited)")
    fault = bounds_fault(state, version)
    if fault:
        raise CheckpointError(f"checkpoint {str(path)!r} holds {fault}, which no state dict does: gradcache train "
                              "never writes that, so the file is damaged or was not written by it; it was refused "
                              "before any walk of it (resume from another checkpoint, previous.pt, or start afresh)")
    stored = state.pop(CHECKSUM_KEY, None)
    if stored is None:
        warnings.warn(f"checkpoint {str(path)!r} carries no checksum (a gradcache train older than checksums, or "
                      "an edited file): damage to it cannot be detected; load it only if you trust where it came "
                      "from", stacklevel=2)
    elif stored != content_sha256(state, version):
        raise CheckpointError(f"checkpoint {str(path)!r} fails its checksum: its contents changed after it was "
                              "written (damaged disk or copy)")
    return state


def _refused(error: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused (an unsupported global or opcode), without its advice to load
    the file with `weights_only=False`: that would run whatever code a hostile file carries."""
    details = [part.strip() for part in str(error).split("\n\n")
               if part.strip() and "weights_only" not in part and "Weights only" not in part]
    return "; ".join(details) or "an object the safe loader does not read"


def load_checkpoint(path: str | os.PathLike, handle: BinaryIO | None = None) -> dict[str, Any]:
    """Read a training checkpoint written by `save_checkpoint`: a file, or a run folder's `last.pt` (no fallback:
    `open_checkpoint` of gradcache/train/checkpoints/run_checkpoint.py chooses between `last.pt` and
    `previous.pt`); from `handle` where given (`read_checked`)."""
    path = Path(path)
    state = read_checked(path / "last.pt" if path.is_dir() else path, handle)
    if "args" not in state or "model" not in state:
        raise CheckpointError(f"{str(path)!r} is not a gradcache training checkpoint (no 'args' or 'model')")
    return state


def capture_random_state() -> dict[str, Any]:
    """Every generator a training step may draw from, on every rank: torch's CPU generator, the CUDA generator of
    each GPU this process sees (in device order) and Python's `random`. Rank 0's at the top (a one-process run's
    layout); over several ranks each rank's own too, in rank order, under "ranks": a collective, so call it on
    every rank (a save does)."""
    own: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        own["cuda"] = torch.cuda.get_rng_state_all()
    if distributed.world_size() == 1:
        return own
    ranks: list[dict[str, Any] | None] = [None] * distributed.world_size()
    dist.all_gather_object(ranks, own)  # (world_size,) of each rank's generators; a few KiB each
    return {**ranks[0], RANKS_KEY: ranks}


def restore_random_state(state: dict[str, Any]) -> None:
    """Put back this rank's generators as `capture_random_state` recorded them: rank r's own. A rank the
    checkpoint lacks (it was saved by fewer ranks, or before each rank's were kept) takes rank 0's, as every rank
    of a new run starts from one seed, and rank 0 says so on stderr where the ranks differ in number. CUDA states
    go to the GPUs by device index; where this process sees another number of GPUs than the saving one did, the
    GPUs both have get theirs, the others keep the run's seed, and rank 0 says so on stderr: the weights and the
    optimizer resume exactly on any number of GPUs, and the random state decides only which dropout masks come
    after the resume, so it does not refuse the resume."""
    ranks = state.get(RANKS_KEY, [state])
    rank = distributed.rank()
    world_size = distributed.world_size()
    if RANKS_KEY in state and len(ranks) != world_size and rank == 0:
        others = (f"ranks {len(ranks)} to {world_size - 1} take rank 0's" if world_size > len(ranks)
                  else f"those of ranks {world_size} to {len(ranks) - 1} are not used")
        print(f"gradcache train: the checkpoint holds the random states of {len(ranks)} ranks and the run resumes "
              f"on {world_size}: each rank takes its own, {others}", file=sys.stderr)
    own = ranks[rank] if rank < len(ranks) else ranks[0]
    torch.set_rng_state(own["torch"])
    version, internal, gauss = own["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in own and torch.cuda.is_available():
        _restore_cuda(own["cuda"])


def _restore_cuda(states: list[torch.Tensor]) -> None:
    """`states` (one per GPU of the saving process, in device order) into this process's GPUs, by index."""
    visible = torch.cuda.device_count()
    for index, generator in enumerate(states[:visible]):
        torch.cuda.set_rng_state(generator, index)
    if len(states) != visible and distributed.rank() == 0:
        kept = (f"GPUs {len(states)} to {visible - 1} keep the run's seed" if visible > len(states)
                else f"the states of GPUs {visible} to {len(states) - 1} are not used")
        print(f"gradcache train: the checkpoint holds the CUDA random states of {len(states)} GPU(s) per process, "
              f"this process sees {visible}: they are restored by device index ({kept}), so dropout after the "
              "resume differs from the run that saved", file=sys.stderr)
