"""How `--resume` merges a checkpoint's run options with the command line.

The resumed run is the run that was interrupted: its options come from the checkpoint. The run-local options
(`RUN_LOCAL`) may be given anew; `--steps` or `--epochs` may lengthen the run (never shorten it: checked
against the data in `check_length`); any other option given on the command line must equal the checkpoint's,
or the resume is refused, naming the option.
"""
from __future__ import annotations

import dataclasses

from torch import nn

from gradcache.train.checkpoint import CheckpointError
from gradcache.train.config import MODEL_FIELDS, RunConfig
from gradcache.train.modes import MODES
from gradcache.train.run import build_model
from gradcache.train.run_checkpoint import RunCheckpoint, open_checkpoint

# --cpu-offload only moves where the shards live, so a resumed run may turn it on or off.
RUN_LOCAL = ("device", "output_dir", "quiet", "workers", "threads", "resume", "checkpoint_every", "eval_every",
             "cpu_offload")
LENGTH = ("steps", "epochs")


def merge_resume(given: RunConfig, explicit: set[str]) -> tuple[RunConfig, RunCheckpoint]:
    """The checkpoint's options with the run-local ones (and a new length) from the command line.

    Raises:
        CheckpointError: no checkpoint there, one of another kind, mode or model, or an option that differs.
    """
    saved = open_checkpoint(given.resume)
    if "fsdp" in explicit and not saved.sharded:
        raise CheckpointError(f"--resume {given.resume} is a single-file checkpoint (last.pt) of a run without "
                              "--fsdp; resume it without --fsdp, or start a new run with --fsdp")
    meta = saved.meta()
    stored_mode = meta["args"].get("mode")
    if stored_mode != given.mode:
        raise CheckpointError(f"{given.resume} is a {stored_mode} checkpoint; resume it with "
                              f"`gradcache train {stored_mode} --resume ...`")
    stored = RunConfig.from_dict(meta["args"])
    for key in sorted(explicit - set(RUN_LOCAL) - set(LENGTH)):
        if getattr(stored, key) != getattr(given, key):
            kind = "a different model" if key in MODEL_FIELDS else "a run with different options"
            raise CheckpointError(f"--resume {given.resume} holds {kind}: it was trained with "
                                  f"--{key.replace('_', '-')} {getattr(stored, key)!r}, this command gives "
                                  f"{getattr(given, key)!r}; drop the option to resume, or start a new run")
    merged = dataclasses.replace(stored, **{key: getattr(given, key) for key in RUN_LOCAL})
    if explicit & set(LENGTH):
        merged = dataclasses.replace(merged, steps=given.steps, epochs=given.epochs)
    if merged.output_dir is None:
        merged = dataclasses.replace(merged, output_dir=str(saved.path.parent))
    if saved.sharded != merged.fsdp:
        raise CheckpointError(f"--resume {given.resume} is a sharded checkpoint but its run has no --fsdp; "
                              "it was not written by gradcache train")
    mode = MODES[merged.mode]
    saved.check_fits(nn.ModuleDict({"model": build_model(mode, merged), "loss": mode.build_loss(merged)}))
    return merged, saved


def check_length(config: RunConfig, saved: RunCheckpoint, train_size: int) -> None:
    """A resumed run may be made longer, not shorter than the run it continues."""
    before = saved.meta()["total_steps"]
    after = config.total_steps(train_size)
    if after < before:
        given = f"--steps {config.steps}" if config.steps is not None else f"--epochs {config.epochs}"
        raise CheckpointError(f"--resume {config.resume}: {given} gives {after} steps, fewer than the {before} the "
                              f"run was set to; a resume may lengthen a run, not shorten it: give at least {before} "
                              "steps, or drop the option")
