"""What one training run is made of, assembled from its RunConfig and its mode, and what it does per step.

`Run` holds the model and loss (together `trained`, what a checkpoint saves), the optimizer over their
(possibly sharded) parameters, the learning-rate schedule, the gradient scaler, the strategy and the
checkpoint; it starts at step 0 (evaluated) or at a checkpoint's step; `step` is one optimizer step.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import get_total_norm

from gradcache import distributed
from gradcache.inputs import is_texts
from gradcache.non_finite import NonFiniteError, NonFiniteLossError
from gradcache.train.checkpoints.atomic import (
    capture_random_state,
    restore_random_state,
)
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint
from gradcache.train.checkpoints.meta import CheckpointMeta
from gradcache.train.compilation import compile_encoders, compile_errors, compile_failed
from gradcache.train.config import RunConfig
from gradcache.train.data.images.augment import to_model_input
from gradcache.train.data.splits import Splits
from gradcache.train.errors import TrainingDiverged, UsageError
from gradcache.train.modes import Mode, mode_of
from gradcache.train.modes.assembly import build_loss, build_model
from gradcache.train.optim.optimizers import build_optimizer, scaled_learning_rate
from gradcache.train.optim.schedule import warmup_cosine
from gradcache.train.parallel.placement import Placement, device_of
from gradcache.train.progress import startup_phase
from gradcache.train.strategy_choice import build_strategy


class StepResult(NamedTuple):
    loss: torch.Tensor
    learning_rate: float  # the rate the step ran at
    skipped: bool  # fp16: the gradient scaler found an overflow and skipped the optimizer step
    stop: bool  # some rank received a stop signal: every rank saves and stops after this step


@dataclass
class Progress:
    """Where a run stands: the first step to train, the time spent before, what was measured at step 0."""

    start_step: int = 0
    elapsed_before: float = 0.0
    baselines: dict[str, float] = field(default_factory=dict)
    initial: dict[str, float] = field(default_factory=dict)  # the held-out metrics at step 0


class Run:
    """A run at its first step to train: step 0 of a new run, or the step of `saved`, the checkpoint it continues."""

    def __init__(self, config: RunConfig, data: Splits, placement: Placement,
                 saved: RunCheckpoint | None = None) -> None:
        self.config, self.data, self.placement = config, data, placement
        self.mode: Mode = mode_of(config)
        self.device = device_of(config.device)
        if self.device.type == "cpu":  # leave the cores that data workers use to them
            threads = config.threads or max(1, (os.cpu_count() or 1) - config.workers)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        self.steps = config.total_steps(len(data.train))
        torch.manual_seed(config.seed)
        speaks = not config.quiet and distributed.rank() == 0
        startup_phase(config.mode, f"loading the model (--model {config.model})", speaks)
        self.model = build_model(self.mode, config).to(self.device)
        self.loss = build_loss(self.mode, config).to(self.device)
        self.guide = self.mode.build_guide(config)  # frozen: not in `trained`, the optimizer or the checkpoint
        if self.guide is not None:
            self.guide = self.guide.to(self.device).eval().requires_grad_(False)
        _check_finite_weights(config, self.model, self.guide)
        self.trained = nn.ModuleDict({"model": self.model, "loss": self.loss})
        if saved is None:
            self.mode.initialise(config, self.model, self.loss)
        # LoRA: the checkpoint leaves the frozen base out (checkpoints/model_state.py); its size is said once.
        # Counted before placing: a ZeRO-3 parameter holds no elements of its own once partitioned
        self._trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self._frozen = sum(p.numel() for p in self.model.parameters()) - self._trained
        # step 0 is evaluated before placing: one plain model on rank 0, whatever the placement
        self.progress = Progress() if saved is not None else self._step_zero()
        # compiled in place before placing: each wrapper holds the compiled module, the names stay the eager ones
        encoders = placement.place(compile_encoders(self.mode.encoders(self.model, self.guide), config), self.device)
        # after placing: the optimizer must hold the sharded parameters, not the ones fully_shard replaced
        lr = scaled_learning_rate(config.lr, config.batch_size, config.base_batch_size, config.lr_scaling)
        self.optimizer = build_optimizer(config.optimizer, [self.model, self.loss], lr, config.weight_decay,
                                         config.momentum)
        encoders = placement.with_optimizer(encoders, self.optimizer, self.trained)  # DeepSpeed: the engine
        # after the engine: DeepSpeed drops the optimizer's empty parameter groups (LoRA's: no biases, no norms)
        self.scheduler = warmup_cosine(self.optimizer, self._warmup_steps(fresh=saved is None), self.steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        self.strategy = build_strategy(config, encoders, self.loss, self.scaler, self.mode.trim_padding,
                                       self.mode.chunk_sizes(config), self.mode.sparse_cache,
                                       self.mode.reused_modules(config, self.model))
        self.checkpoint = placement.checkpoint(config.output_dir)
        self._parameters = [p for p in self.trained.parameters() if p.requires_grad]  # after placing: the shards
        self.last_saved: RunCheckpoint | None = None
        if saved is not None:
            self.progress = self._resume(saved)  # a checkpoint of another model fails here, before any write
        self._compile_errors = compile_errors(config)  # none without --compile
        self._started = time.perf_counter()

    def _warmup_steps(self, fresh: bool) -> int:
        """--warmup, cut to the run's length: the whole run then warms up (a new run says so on stderr, once)."""
        if self.config.warmup > self.steps and fresh and distributed.rank() == 0:
            print(f"gradcache train: --warmup {self.config.warmup} is longer than the run's {self.steps} steps; it is "
                  f"cut to {self.steps}, so the whole run warms up (give --warmup below {self.steps} for a cosine "
                  "decay after it)", file=sys.stderr)
        return min(self.config.warmup, self.steps)

    def _step_zero(self) -> Progress:
        """The model as initialised, evaluated, and the baselines beside it (rank 0, which writes the logs)."""
        if distributed.rank() != 0:
            return Progress()
        startup_phase(self.config.mode, f"evaluating step 0 on {len(self.data.test)} held-out {self.mode.items}",
                      not self.config.quiet)
        initial = self.mode.evaluate(self.config, self.model, self.data, self.device)
        return Progress(baselines=self.mode.baselines(self.config, self.data, initial), initial=initial)

    def _resume(self, saved: RunCheckpoint) -> Progress:
        """Continue from `saved`; a longer run than the one saved gets its schedule recomputed (said on stderr)."""
        meta = CheckpointMeta.from_dict(saved.meta(), saved)
        self.placement.load(saved, self.trained, self.optimizer)  # DeepSpeed: into its engine
        if any_rank([not _all_finite(self._parameters)])[0]:
            raise TrainingDiverged(f"checkpoint {saved.path} holds non-finite weights (NaN or infinite): its run had "
                                   "diverged before it was saved, or the file was edited. Resume from an earlier "
                                   "checkpoint (previous.pt) with a lower --lr, or start afresh")
        if meta.step >= self.steps and distributed.rank() == 0:
            print(f"gradcache train: the run in {saved.path.parent} is already complete (step {meta.step} of "
                  f"{self.steps}): no step to train; its final evaluation, metrics.json and model/ are written "
                  "again. Give a larger --steps or --epochs to train it further", file=sys.stderr)
        self.scheduler.load_state_dict({**meta.scheduler, "lr_lambdas": [None] * len(self.scheduler.lr_lambdas)})
        self.scaler.load_state_dict(meta.scaler)
        if meta.total_steps != self.steps:
            self._lengthen_schedule(meta.total_steps, meta.step)
        self.last_saved = saved
        if distributed.rank() == 0:
            print(f"gradcache train: resumed from {saved.path} at step {meta.step} of {self.steps}: restored the "
                  "model's trained parameters, the loss, the optimizer, the learning-rate schedule, the gradient "
                  "scaler, the random state and the data position", file=sys.stderr)
        progress = Progress(meta.step, meta.elapsed_s, meta.baselines, meta.initial)
        restore_random_state(meta.random_state)  # last, after everything that could draw numbers
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
    def step(self, inputs: list[Any], step: int, stop_requested: bool = False) -> StepResult:
        """One strategy step and one optimizer step, then the ranks agree whether to stop (any rank's
        `stop_requested`) and whether the run diverged: a non-finite loss or embedding (raised by the losses), a
        non-finite gradient (fp32/bf16; in fp16 the scaler skips such a step) or weight raises TrainingDiverged
        on every rank, before anything is saved."""
        inputs = [_to_device(value, self.device) for value in inputs]
        try:
            loss = self.strategy.step(*inputs)
        except NonFiniteError as error:
            what = "the loss" if isinstance(error, NonFiniteLossError) else "the embeddings"
            raise self._diverged(what, step) from error
        except self._compile_errors as error:
            raise compile_failed(error, self.config, step) from error
        gradients_finite = self.scaler.is_enabled() or _all_finite([p.grad for p in self._parameters])
        learning_rate = self.optimizer.param_groups[0]["lr"]
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        gradients_finite = self.placement.optimizer_step(self.optimizer, self.scaler) and gradients_finite
        skipped = scale is not None and self.scaler.get_scale() < scale  # the scaler backs off on an overflow
        with warnings.catch_warnings():  # a skipped step still advances the schedule: it follows the step count
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step()` before `optimizer.step()`")
            self.scheduler.step()
        self.mode.after_step(self.config, self.loss)
        weights_finite = _all_finite(self._parameters)
        stop, bad_gradients, bad_weights = any_rank([stop_requested, not gradients_finite, not weights_finite])
        if bad_gradients or bad_weights:
            raise self._diverged("the gradients" if bad_gradients else "the weights", step)
        return StepResult(loss, learning_rate, skipped, stop)

    def _diverged(self, what: str, step: int) -> TrainingDiverged:
        kept = (f"the last good checkpoint {self.last_saved} is kept" if self.last_saved
                else "no checkpoint was saved yet")
        return TrainingDiverged(f"{what} became non-finite at step {step + 1} (of {self.steps}); {kept}. Lower --lr, "
                                "raise --warmup, or use --precision bf16 instead of fp16.")

    def evaluate(self) -> dict[str, float]:
        with self.placement.gathered(self.model):
            return self.mode.evaluate(self.config, self.model, self.data, self.device)

    def elapsed(self) -> float:
        return self.progress.elapsed_before + time.perf_counter() - self._started

    def save(self, step: int, position: tuple[int, int]) -> None:
        """The checkpoint at `step`; `position` is (epoch, batch within the epoch)."""
        meta = CheckpointMeta(config=self.config, step=step, total_steps=self.steps, epoch=position[0],
                              batch_in_epoch=position[1], scheduler=self.scheduler.state_dict(),
                              scaler=self.scaler.state_dict(), random_state=capture_random_state(),
                              elapsed_s=self.elapsed(), baselines=self.progress.baselines,
                              initial=self.progress.initial)
        self.checkpoint.save(self.trained, self.optimizer, meta.to_dict())
        if self._frozen and self.last_saved is not self.checkpoint and distributed.rank() == 0:
            path = self.checkpoint.path
            size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*")
                                                                  if f.is_file())
            print(f"gradcache train: {self.checkpoint.path.name} holds the model's {self._trained:,} trained "
                  f"parameters and their optimizer state, {size / 2**20:.2f} MiB; its {self._frozen:,} frozen "
                  "parameters are not saved: they are built again from the run's options (--model)", file=sys.stderr)
        self.last_saved = self.checkpoint


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _all_finite(tensors: list[torch.Tensor | None]) -> bool:
    """Whether every entry of `tensors` (None skipped; a shard's local part) is finite: the largest |x| is."""
    # FSDP2: a DTensor's local shard; ZeRO-3: a parameter's partition (ds_tensor; the parameter itself is empty)
    local = [t.to_local() if hasattr(t, "to_local") else getattr(t, "ds_tensor", t) for t in tensors if t is not None]
    return not local or bool(torch.isfinite(get_total_norm(local, norm_type=math.inf)))


def any_rank(flags: list[bool]) -> list[bool]:
    """Each flag, true when it is true on any rank: one small all-reduce a step, only under torch.distributed."""
    if not distributed.is_distributed() or distributed.world_size() == 1:
        return flags
    nccl = dist.get_backend() == "nccl"  # NCCL reads only CUDA tensors
    tensor = torch.tensor(flags, dtype=torch.int32, device=torch.cuda.current_device() if nccl else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(flag) for flag in tensor.tolist()]


def _to_device(value: Any, device: torch.device) -> Any:
    """A batch on `device`; from pinned memory (the loaders pin for CUDA) the copy does not block the host.
    Images that come as uint8 (clip's; SimCLR's views are float, made by float augmentations) cross as bytes, a
    quarter of float32's, and are normalised on the device (`to_model_input`)."""
    if isinstance(value, dict):
        return {k: v.to(device, non_blocking=True) for k, v in value.items()}
    if is_texts(value):  # raw text pairs (--kind cross-encoder): its encoder tokenises them onto its device
        return value
    if value.dtype == torch.uint8:
        return to_model_input(value.to(device, non_blocking=True))
    return value.to(device, non_blocking=True)


def _check_finite_weights(config: RunConfig, model: nn.Module, guide: nn.Module | None) -> None:
    """UsageError naming the option whose folder gives NaN or inf weights, which would train to NaN from step 1
    (a resumed LoRA run keeps its base's weights from the folder)."""
    from gradcache.models.finite_weights import check_finite_weights

    for option, value, module in (("--model", config.model, model), ("--guide", config.guide, guide)):
        try:
            check_finite_weights(module if module is not None else nn.Module())
        except ValueError as error:
            raise UsageError(f"{option} {value}: {error}") from error
