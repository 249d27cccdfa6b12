"""How `--resume` chooses its checkpoint and merges the checkpoint's run options with the command line.

`--resume PATH` continues from a checkpoint file, or from the newest good checkpoint of a run folder;
`--resume auto` (with `--output-dir`) does the same in the output folder when it holds a checkpoint and starts
the run afresh there when it holds none: the same command then starts a run and restarts it after any failure
(`torchrun --max-restarts`). Rank 0 chooses and tells the other ranks (`choose_checkpoint`).

The resumed run is the run that was interrupted: its options come from the checkpoint. The run-local options
(`run_local` in their RunConfig field) may be given anew; those `kept_unless_given`, not given, stay as the run
had them. `--steps` or `--epochs` may lengthen the run (never shorten it: checked against the data in
`check_length`); any other option given on the command line must equal the checkpoint's, or the resume is
refused, naming the option.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from gradcache.train.checkpoints.run_checkpoint import (
    Found,
    RunCheckpoint,
    find_checkpoint,
    kind_of,
    locate,
)
from gradcache.train.checkpoints.meta import CheckpointMeta
from gradcache.train.config import (
    KEPT_UNLESS_GIVEN,
    MODEL_FIELDS,
    RUN_LOCAL,
    RunConfig,
    with_absolute_paths,
)
from gradcache.train.errors import CheckpointError
from gradcache.train.run_folder.lock import decided_by_rank_zero

LENGTH = ("steps", "epochs")
AUTO = "auto"  # --resume auto


def choose_checkpoint(resume: str, output_dir: str) -> Found:
    """The checkpoint `--resume` names (`--resume auto`: `output_dir`'s newest good one, if any), chosen on rank 0
    (warning on stderr of a newer one it falls back from) and given to every rank.

    Raises:
        CheckpointError: on every rank, where rank 0 found none or only bad ones (see `locate`).
    """
    here: list[Found] = []  # rank 0's own choice, checked: what it checked is what it loads (a last.ds's copy)

    def on_rank_zero() -> tuple[str | None, list[tuple[str, str]]]:
        found = find_checkpoint(output_dir) if resume == AUTO else locate(resume)
        found.warn()
        here.append(found)
        chosen = found.chosen
        return (None if chosen is None else str(chosen.path), [(str(path), reason) for path, reason in found.skipped])

    path, skipped = decided_by_rank_zero(on_rank_zero)
    if here:
        return here[0]
    return Found(None if path is None else kind_of(path)(path), [(Path(p), reason) for p, reason in skipped])


def merge_resume(given: RunConfig, explicit: set[str], saved: RunCheckpoint) -> RunConfig:
    """The options of `saved` (the checkpoint `given.resume` names) with the run-local ones (and a new length)
    from the command line.

    Raises:
        CheckpointError: a checkpoint of another kind or mode, or an option that differs. A checkpoint whose
            tensors do not fit the model its options build is refused when the run loads it (`RunCheckpoint.load`),
            before anything is written, so the model is built once.
    """
    if "fsdp" in explicit and not saved.sharded:
        raise CheckpointError(f"--resume {given.resume} is a single-file checkpoint (last.pt) of a run without "
                              "--fsdp; resume it without --fsdp, or start a new run with --fsdp")
    stored_mode = saved.meta().get("args", {}).get("mode")
    if stored_mode != given.mode:
        raise CheckpointError(f"{given.resume} is a {stored_mode} checkpoint; resume it with "
                              f"`gradcache train {stored_mode} --resume ...`")
    stored = with_absolute_paths(CheckpointMeta.from_dict(saved.meta(), saved).config)  # older runs kept paths as given
    for key in sorted(explicit - set(RUN_LOCAL) - set(LENGTH)):
        if getattr(stored, key) != getattr(given, key):
            kind = "a different model" if key in MODEL_FIELDS else "a run with different options"
            raise CheckpointError(f"--resume {given.resume} holds {kind}: it was trained with "
                                  f"--{key.replace('_', '-')} {getattr(stored, key)!r}, this command gives "
                                  f"{getattr(given, key)!r}; drop the option to resume, or start a new run")
    merged = dataclasses.replace(stored, **{key: getattr(given, key) for key in RUN_LOCAL
                                            if key in explicit or key not in KEPT_UNLESS_GIVEN})
    if explicit & set(LENGTH):
        merged = dataclasses.replace(merged, steps=given.steps, epochs=given.epochs)
    if merged.output_dir is None:
        merged = dataclasses.replace(merged, output_dir=str(saved.path.parent))
    if saved.sharded != merged.fsdp:
        raise CheckpointError(f"--resume {given.resume} is a sharded checkpoint but its run has no --fsdp; "
                              "it was not written by gradcache train")
    return merged  # whether it fits the model is checked where the run has built it, on loading (Run._resume)


def check_length(config: RunConfig, saved: RunCheckpoint, train_size: int) -> None:
    """A resumed run may be made longer, not shorter than the run it continues; a checkpoint past the end of its
    own run (never written so: an edited file) is refused."""
    meta = CheckpointMeta.from_dict(saved.meta(), saved)
    if meta.step > meta.total_steps:
        raise CheckpointError(f"checkpoint {saved.path} is at step {meta.step} of a run of {meta.total_steps} steps; "
                              "gradcache train never saves past its run's end, so the file was edited or damaged. "
                              "Resume from another checkpoint (previous.pt), or start afresh")
    before = meta.total_steps
    after = config.total_steps(train_size)
    if after < before:
        given = f"--steps {config.steps}" if config.steps is not None else f"--epochs {config.epochs}"
        raise CheckpointError(f"--resume {config.resume}: {given} gives {after} steps, fewer than the {before} the "
                              f"run was set to; a resume may lengthen a run, not shorten it: give at least {before} "
                              "steps, or drop the option")
