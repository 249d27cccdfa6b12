"""The resolver of a run's checkpoints: which kind a run writes (`run_checkpoint`), which kind a run folder holds
(`kind_in`), and which checkpoint of it a command reads (`open_checkpoint`, `locate`, `find_checkpoint`).

The kinds it chooses between implement one interface (`RunCheckpoint`, interface.py) and live apart, each
importing nothing of this module:
- `last.pt` (`FileCheckpoint`, file_checkpoint.py): one file that rank 0 writes atomically.
- `last.dcp` (`ShardedCheckpoint`, sharded_checkpoint.py, `--fsdp` runs): a folder of shards every rank writes.
- `last.ds` (`DeepSpeedCheckpoint`, deepspeed_checkpoint.py, `--deepspeed` runs): DeepSpeed's own files.

All hold the trained modules (`{"model": ..., "loss": ...}`), the optimizer, and the same `meta`: the run's
options (`"args"`, a RunConfig.to_dict), step, scheduler, scaler, random state, baselines, elapsed time; all
carry checksums of what they hold. Each save first renames the checkpoint it replaces to `previous.pt` (or
`previous.dcp`, `previous.ds`), so a run folder holds the newest two. `open_checkpoint` is the one resolver: given
a run folder it takes the newest checkpoint that passes its checks, falling back to the previous one with a
warning naming both; given a checkpoint itself it takes that one or refuses it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gradcache.train.checkpoints.atomic import is_sharded_folder
from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint
from gradcache.train.checkpoints.file_checkpoint import FileCheckpoint
from gradcache.train.checkpoints.interface import RunCheckpoint
from gradcache.train.checkpoints.sharded_checkpoint import ShardedCheckpoint
from gradcache.train.errors import CheckpointError

__all__ = ["DAMAGED_SUFFIX", "KINDS", "DeepSpeedCheckpoint", "FileCheckpoint", "Found", "RunCheckpoint",
           "ShardedCheckpoint", "checkpoint_kinds", "find_checkpoint", "is_run_folder", "kind_in", "kind_of",
           "locate", "open_checkpoint", "run_checkpoint", "run_folder_of"]

DAMAGED_SUFFIX = ".damaged"  # a newest checkpoint that failed its checks, set aside when a run resumes past it


KINDS: dict[bool, type[RunCheckpoint]] = {False: FileCheckpoint, True: ShardedCheckpoint}


def checkpoint_kinds() -> tuple[type[RunCheckpoint], ...]:
    """The kinds of checkpoint a run writes (one per run: `--fsdp`, `--deepspeed` or neither), in the order a run
    folder is searched."""
    return ShardedCheckpoint, DeepSpeedCheckpoint, FileCheckpoint


def kind_of(path: str | os.PathLike) -> type[RunCheckpoint]:
    """The kind of the checkpoint at `path`, by its name: `last.ds`/`previous.ds` (--deepspeed), a folder
    (`last.dcp`, --fsdp) or a file (`last.pt`)."""
    path = Path(path)
    if path.suffix == ".ds":
        return DeepSpeedCheckpoint
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
