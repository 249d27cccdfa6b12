"""The training loop of `gradcache train simclr|clip`: one strategy step, one optimizer step, per global batch.

    for each step s (from the checkpoint's step on a resume):
        batch s of the data order (a function of seed and step)  ->  this rank's slice
        loss = strategy.step(*inputs)            # GradCache / NaiveAccumulation / FullBatch: writes .grad
        scaler.step(optimizer); scaler.update()  # one path for every precision: the scaler is off unless fp16
        optimizer.zero_grad(); scheduler.step(); loss.clamp_logit_scale()   # CLIP: clamp after the step
        log; every N steps an atomic checkpoint and (optionally) an evaluation

Rank 0 alone writes files under torch.distributed; the encoders are wrapped in DDP and each rank encodes its
contiguous slice of the global batch, the core gathering the embeddings so the loss sees all of them.

With `--fsdp` each encoder is sharded block by block (FSDP2) instead, the optimizer is built over the shards,
every rank writes its shards to `last.dcp` (resumable on any number of ranks; the random state saved is rank
0's, which every rank restores, as with `last.pt`), and every rank runs the evaluations, whose forwards gather
the shards. Without torchrun, `--fsdp` starts a one-process gloo group (NCCL on CUDA) and ends it afterwards.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from gradcache.train.augment import simclr_augmentation
from gradcache.train.batches import StepSampler, training_batches
from gradcache.train.checkpoint import CheckpointError, capture_random_state, restore_random_state, save_checkpoint
from gradcache.train.image_set import DataSplits
from gradcache.train.optim import build_optimizer, scaled_learning_rate
from gradcache.train.recipe import (
    build_loss,
    build_model,
    build_strategy,
    build_tokenizer,
    encoders_of,
    load_data,
    model_signature,
)
from gradcache.train.run_eval import baseline_metrics, evaluate_model
from gradcache.train.run_log import RunLog
from gradcache.train.schedule import warmup_cosine


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed_if_launched(device: str) -> None:
    """Under `torchrun` (WORLD_SIZE > 1 in the environment) join the process group: NCCL on CUDA, else gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def _device_of(name: str) -> torch.device:
    """`--device cuda` under torchrun means this process's GPU, cuda:LOCAL_RANK."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None and dist.is_initialized():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def total_steps(args: argparse.Namespace, train_size: int) -> int:
    """`--steps`, or `--epochs` full passes over the training images (partial last batches dropped)."""
    return args.steps if args.steps is not None else args.epochs * (train_size // args.batch_size)


def _wrap(module: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    if world_size == 1:
        return module
    return nn.parallel.DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


def _arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The run's options as plain values (what a checkpoint stores)."""
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}


@contextmanager
def _process_group_for(args: argparse.Namespace) -> Iterator[None]:
    """`--fsdp` without torchrun: a one-process group (FSDP2 needs one even on one rank), ended on the way out."""
    if not args.fsdp or dist.is_initialized():
        yield
        return
    backend = "cpu:gloo,cuda:nccl" if args.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def _gathered(model: nn.Module, sharded: bool) -> Iterator[None]:
    """Every FSDP unit of `model` unsharded (evaluation calls methods such as `embed`, which the forward hooks of
    the root unit do not see); a collective, so every rank enters it."""
    units = [m for m in model.modules() if callable(getattr(m, "set_requires_gradient_sync", None))] if sharded else []
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()


def train(args: argparse.Namespace, checkpoint: dict[str, Any] | None = None,
          data: DataSplits | None = None) -> dict[str, Any]:
    """Run (or, given `checkpoint`, continue) training; return the run summary also written to metrics.json."""
    with _process_group_for(args):
        return _train(args, checkpoint, data)


def _train(args: argparse.Namespace, checkpoint: dict[str, Any] | None, data: DataSplits | None) -> dict[str, Any]:
    rank, world_size = _distributed()
    device = _device_of(args.device)
    if device.type == "cpu":
        _set_threads(args.threads or max(1, (os.cpu_count() or 1) - args.workers))
    data = data if data is not None else load_data(args)
    steps = total_steps(args, len(data.train))
    output_dir = Path(args.output_dir)

    torch.manual_seed(args.seed)
    model = build_model(args).to(device)
    loss_fn = build_loss(args).to(device)
    tokenizer = build_tokenizer(args)
    lr = scaled_learning_rate(args.lr, args.batch_size, args.base_batch_size, args.lr_scaling)
    encoders = encoders_of(model, args.mode)
    if args.fsdp:
        from gradcache.train.fsdp import load_sharded, save_sharded, shard_encoder

        for encoder in [encoders] if isinstance(encoders, nn.Module) else encoders:
            shard_encoder(encoder, cpu_offload=args.cpu_offload)
        wrapped = encoders
    else:
        wrapped = _wrap(encoders, device, world_size) if isinstance(encoders, nn.Module) else [
            _wrap(e, device, world_size) for e in encoders]
    # after sharding: the optimizer must hold the sharded parameters, not the ones fully_shard replaced
    optimizer = build_optimizer(args.optimizer, [model, loss_fn], lr, args.weight_decay, args.momentum)
    scheduler = warmup_cosine(optimizer, min(args.warmup, steps), steps)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    strategy = build_strategy(args, wrapped, loss_fn, scaler)
    trained = nn.ModuleDict({"model": model, "loss": loss_fn})  # what a sharded checkpoint holds

    start_step, elapsed_before, baselines = 0, 0.0, {}
    if checkpoint is not None and "sharded" in checkpoint:
        if not args.fsdp:
            raise CheckpointError(f"{checkpoint['sharded']} is a sharded checkpoint: resume it with --fsdp")
        checkpoint = load_sharded(checkpoint["sharded"], trained, optimizer)  # refuses another model's shards
    elif checkpoint is not None and args.fsdp:
        raise CheckpointError("a single-file checkpoint (last.pt) cannot resume an --fsdp run; resume without --fsdp")
    elif checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        loss_fn.load_state_dict(checkpoint["loss"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint is not None:
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        start_step, elapsed_before = checkpoint["step"], checkpoint["elapsed_s"]
        baselines = checkpoint["baselines"]
    log = RunLog(output_dir, resume_step=start_step if checkpoint is not None else None, enabled=rank == 0)
    if checkpoint is None and rank == 0:
        baselines = baseline_metrics(args, data, device)
        if baselines:
            log.log_eval(0, {"knn_top1": baselines["knn_top1_random_init"]})
    if checkpoint is not None:
        restore_random_state(checkpoint["random_state"])  # last, after everything that could draw numbers

    sampler = StepSampler(len(data.train), args.batch_size, args.seed, start_step, steps, rank, world_size)
    augmentation = simclr_augmentation(args.image_size, crop_scale=(args.crop_min_scale, 1.0),
                                       jitter_strength=args.jitter_strength,
                                       channel_permutation=args.channel_permutation,
                                       rotation=getattr(args, "rotation", 0.0)) if args.mode == "simclr" else None
    batches = training_batches(data.train, sampler, augmentation, tokenizer, args.workers)
    negatives = 2 * args.batch_size - 2 if args.mode == "simclr" else args.batch_size - 1

    def state(step: int) -> dict[str, Any]:
        """The checkpoint without the trained tensors (which `save` adds, or shards)."""
        epoch, within = sampler.position(step)
        return {
            "args": _arguments(args), "signature": model_signature(args), "step": step, "epoch": epoch,
            "batch_in_epoch": within, "total_steps": steps, "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "random_state": capture_random_state(), "baselines": baselines,
            "elapsed_s": elapsed_before + time.perf_counter() - started,
        }

    def save(step: int) -> Path | None:
        if args.fsdp:  # every rank writes its shards
            return save_sharded(output_dir / "last.dcp", trained, optimizer, extra=state(step))
        if rank != 0:
            return last_saved
        return save_checkpoint({**state(step), "model": model.state_dict(), "loss": loss_fn.state_dict(),
                                "optimizer": optimizer.state_dict()}, output_dir / "last.pt")

    def evaluate() -> dict[str, float]:
        with _gathered(model, args.fsdp):
            return evaluate_model(args, model, data, tokenizer, device)

    evaluating = args.fsdp or rank == 0  # sharded forwards are collectives: every rank takes part
    last_saved = output_dir / ("last.dcp" if args.fsdp else "last.pt") if checkpoint is not None else None
    started = time.perf_counter()
    progress = tqdm(total=steps, initial=start_step, disable=args.quiet or rank != 0 or not sys.stderr.isatty(),
                    desc=f"{args.mode} {args.strategy}", dynamic_ncols=True)
    model.train()
    loss = None  # a resume of a finished run trains no step
    for step, inputs in enumerate(batches, start=start_step):
        step_started = time.perf_counter()
        inputs = [_to_device(value, device) for value in inputs]
        try:
            loss = strategy.step(*inputs)
        except ValueError as error:
            if "non-finite" not in str(error):
                raise
            loss = torch.tensor(math.nan)
        if not torch.isfinite(loss):
            kept = f"the last good checkpoint {last_saved} is kept" if last_saved else "no checkpoint was saved yet"
            raise TrainingDiverged(f"the loss became non-finite at step {step + 1} (of {steps}); {kept}. "
                                   "Lower --lr, raise --warmup, or use --precision bf16 instead of fp16.")
        learning_rate = optimizer.param_groups[0]["lr"]
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if args.mode == "clip":
            loss_fn.clamp_logit_scale(args.max_logit_scale)
        seconds = time.perf_counter() - step_started
        row = {"step": step + 1, "epoch": sampler.position(step)[0], "loss": f"{loss.item():.6f}",
               "lr": f"{learning_rate:.6g}", "samples_per_s": f"{args.batch_size / seconds:.1f}",
               "negatives_per_anchor": negatives, "temperature": f"{getattr(loss_fn, 'temperature', 0):.5g}",
               "elapsed_s": f"{elapsed_before + time.perf_counter() - started:.2f}"}
        log.log_step(row)
        progress.update(1)
        progress.set_postfix(loss=row["loss"][:6], lr=row["lr"], samples_s=row["samples_per_s"], negatives=negatives)
        done = step + 1
        if done % args.checkpoint_every == 0 or done == steps:
            last_saved = save(done)
        if evaluating and args.eval_every and done % args.eval_every == 0 and done != steps:
            log.log_eval(done, evaluate())
    progress.close()
    wall_time = elapsed_before + time.perf_counter() - started
    summary: dict[str, Any] = {}
    final = evaluate() if evaluating else {}
    if rank == 0:
        log.log_eval(steps, final)
        summary = {**final, **baselines, "steps": steps, "wall_time_s": round(wall_time, 2),
                   "peak_memory_mb": round(peak_memory_mb(device), 1), "train_size": len(data.train),
                   "test_size": len(data.test), "skipped_images": len(data.train.skipped),
                   "batch_size": args.batch_size, "negatives_per_anchor": negatives, "strategy": args.strategy,
                   "final_loss": None if loss is None else float(loss), "data": data.name}
        if args.mode == "clip":
            summary["temperature"] = loss_fn.temperature
        log.write_metrics(summary)
        log.plot()
    return summary


def _set_threads(count: int) -> None:
    """Leave the cores that data workers use to them: oversubscribed CPU thread pools mostly wait."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict):
        return {k: v.to(device) for k, v in value.items()}
    return value.to(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux
