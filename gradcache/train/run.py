"""What one training run is made of, assembled from its RunConfig and its mode, and what it does per step.

`Run` holds the model and loss (together `trained`, what a checkpoint saves), the optimizer over their
(possibly sharded) parameters, the learning-rate schedule, the gradient scaler, the strategy and the
checkpoint; it starts at step 0 (evaluated) or at a checkpoint's step; `step` is one optimizer step.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gradcache import distributed
from gradcache.non_finite import NonFiniteLossError
from gradcache.train.checkpoint import capture_random_state, restore_random_state
from gradcache.train.config import RunConfig
from gradcache.train.image_set import DataSplits
from gradcache.train.modes import MODES, Mode
from gradcache.train.optim import build_optimizer, scaled_learning_rate
from gradcache.train.placement import Replicated, device_of
from gradcache.train.run_checkpoint import RunCheckpoint
from gradcache.train.schedule import warmup_cosine
from gradcache.train.strategies import build_strategy


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


@dataclass
class Progress:
    """Where a run stands: the first step to train, the time spent before, what was measured at step 0."""

    start_step: int = 0
    elapsed_before: float = 0.0
    baselines: dict[str, float] = field(default_factory=dict)
    initial: dict[str, float] = field(default_factory=dict)  # the held-out metrics at step 0


class Run:
    """A run at its first step to train: step 0 of a new run, or the step of `saved`, the checkpoint it continues."""

    def __init__(self, config: RunConfig, data: DataSplits, placement: Replicated,
                 saved: RunCheckpoint | None = None) -> None:
        self.config, self.data, self.placement = config, data, placement
        self.mode: Mode = MODES[config.mode]
        self.device = device_of(config.device)
        if self.device.type == "cpu":  # leave the cores that data workers use to them
            threads = config.threads or max(1, (os.cpu_count() or 1) - config.workers)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        self.steps = config.total_steps(len(data.train))
        torch.manual_seed(config.seed)
        self.model = build_model(self.mode, config).to(self.device)
        self.loss = self.mode.build_loss(config).to(self.device)
        self.trained = nn.ModuleDict({"model": self.model, "loss": self.loss})
        if saved is None:
            self.mode.initialise(config, self.model, self.loss)
        # step 0 is evaluated before placing: one plain model on rank 0, whatever the placement
        self.progress = Progress() if saved is not None else self._step_zero()
        encoders = placement.place(self.mode.encoders(self.model), self.device)
        # after placing: the optimizer must hold the sharded parameters, not the ones fully_shard replaced
        lr = scaled_learning_rate(config.lr, config.batch_size, config.base_batch_size, config.lr_scaling)
        self.optimizer = build_optimizer(config.optimizer, [self.model, self.loss], lr, config.weight_decay,
                                         config.momentum)
        self.scheduler = warmup_cosine(self.optimizer, min(config.warmup, self.steps), self.steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        self.strategy = build_strategy(config, encoders, self.loss, self.scaler, self.mode.trim_padding,
                                       self.mode.chunk_sizes(config))
        self.checkpoint = placement.checkpoint(config.output_dir)
        self.last_saved: RunCheckpoint | None = None
        if saved is not None:
            self.progress = self._resume(saved)  # a checkpoint of another model fails here, before any write
        self._started = time.perf_counter()

    def _step_zero(self) -> Progress:
        """The model as initialised, evaluated, and the baselines beside it (rank 0, which writes the logs)."""
        if distributed.rank() != 0:
            return Progress()
        initial = self.mode.evaluate(self.config, self.model, self.data, self.device)
        return Progress(baselines=self.mode.baselines(self.config, self.data, initial), initial=initial)

    def _resume(self, saved: RunCheckpoint) -> Progress:
        """Continue from `saved`; a longer run than the one saved gets its schedule recomputed (said on stderr)."""
        meta = saved.meta()
        saved.load(self.trained, self.optimizer)
        self.scheduler.load_state_dict({**meta["scheduler"], "lr_lambdas": [None] * len(self.scheduler.lr_lambdas)})
        self.scaler.load_state_dict(meta["scaler"])
        if meta["total_steps"] != self.steps:
            self._lengthen_schedule(meta["total_steps"], meta["step"])
        self.last_saved = saved
        initial = meta.get("initial", {})  # checkpoints from before every mode evaluated at step 0 lack it
        progress = Progress(meta["step"], meta["elapsed_s"], meta["baselines"], initial)
        restore_random_state(meta["random_state"])  # last, after everything that could draw numbers
        return progress

    def _lengthen_schedule(self, saved_steps: int, step: int) -> None:
        schedule = self.scheduler.lr_lambdas[0]
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * schedule(step)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        if distributed.rank() == 0:
            print(f"gradcache train: the run is extended from {saved_steps} to {self.steps} steps; the learning-rate "
                  f"schedule is recomputed for {self.steps} steps (warm-up {schedule.warmup_steps}, then cosine "
                  f"decay to step {self.steps}), continuing at step {step} with lr {group['lr']:.6g}",
                  file=sys.stderr)

    # --- one step ---------------------------------------------------------------------------------------
    def step(self, inputs: list[Any], step: int) -> tuple[torch.Tensor, float]:
        """One strategy step and one optimizer step; returns the loss and the learning rate it ran at."""
        inputs = [_to_device(value, self.device) for value in inputs]
        try:
            loss = self.strategy.step(*inputs)
        except NonFiniteLossError as error:
            kept = (f"the last good checkpoint {self.last_saved} is kept" if self.last_saved
                    else "no checkpoint was saved yet")
            raise TrainingDiverged(f"the loss became non-finite at step {step + 1} (of {self.steps}); {kept}. "
                                   "Lower --lr, raise --warmup, or use --precision bf16 instead of fp16.") from error
        learning_rate = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)  # one path for every precision: the scaler is off unless fp16
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.mode.after_step(self.config, self.loss)
        return loss, learning_rate

    def evaluate(self) -> dict[str, float]:
        with self.placement.gathered(self.model):
            return self.mode.evaluate(self.config, self.model, self.data, self.device)

    def elapsed(self) -> float:
        return self.progress.elapsed_before + time.perf_counter() - self._started

    def save(self, step: int, position: tuple[int, int]) -> None:
        """The checkpoint at `step`; `position` is (epoch, batch within the epoch)."""
        meta = {"args": self.config.to_dict(), "signature": self.config.model_signature(), "step": step,
                "epoch": position[0], "batch_in_epoch": position[1], "total_steps": self.steps,
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "random_state": capture_random_state(), "baselines": self.progress.baselines,
                "initial": self.progress.initial, "elapsed_s": self.elapsed()}
        self.checkpoint.save(self.trained, self.optimizer, meta)
        self.last_saved = self.checkpoint


def build_model(mode: Mode, config: RunConfig) -> nn.Module:
    """The mode's freshly initialised model, with gradient checkpointing when asked."""
    model = mode.build_model(config)
    if config.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict):
        return {k: v.to(device) for k, v in value.items()}
    return value.to(device)
