"""Everything `gradcache train` checks before a run writes anything: option values, the output folder (taken
with its lock), the resume and the data. A problem raises UsageError, DataError or CheckpointError (exit status 2), naming the
option, the value and the fix."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from gradcache import distributed
from gradcache.losses.checks import check_temperature, check_tile_size
from gradcache.losses.queue import check_queue_options
from gradcache.options import check_chunk_tokens, check_memory_budget
from gradcache.ranges import is_finite, within
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint, run_folder_of
from gradcache.train.checkpoints.resume import (
    AUTO,
    check_length,
    choose_checkpoint,
    merge_resume,
)
from gradcache.train.compilation import check_compile
from gradcache.models import IMAGE_ENCODER_PRESETS
from gradcache.train.config import MODEL_FIELDS, RunConfig, with_absolute_paths
from gradcache.train.data.bad_data import check_bad_share
from gradcache.train.data.held_out import held_out_size
from gradcache.train.data.images.files import BUILT_IN_DATA
from gradcache.train.data.resources import reading_data
from gradcache.train.data.splits import Splits
from gradcache.train.errors import CheckpointError, UsageError
from gradcache.train.matryoshka_dims import check_dims
from gradcache.train.modes import mode_of
from gradcache.train.parallel.deepspeed import run_settings
from gradcache.train.parallel.placement import check_device, local_rank
from gradcache.train.progress import startup_phase
from gradcache.train.run_folder.layout import RUN_FILES
from gradcache.train.run_folder.lock import (
    RunFolderLock,
    decided_by_rank_zero,
    remove_stale_temporaries,
)
from gradcache.train.run_folder.reporters import check_report_to
from gradcache.train.strategy_choice import build_strategy


def prepare_run(given: RunConfig, explicit: set[str]
                ) -> tuple[RunConfig, RunCheckpoint | None, Splits, contextlib.AbstractContextManager]:
    """Check the options, take the output folder (its lock: see gradcache/train/run_folder/lock.py), merge a resume
    checkpoint and load the data; return them with the folder's lock, which the caller holds while it trains.
    A check that fails releases the lock and writes nothing (a folder it created is removed again)."""
    output = _output_folder(given, explicit)
    lock = RunFolderLock(output) if distributed.rank() == 0 else contextlib.nullcontext()

    def claim() -> None:
        lock.acquire()
        remove_stale_temporaries(output)  # what a save killed half-way left

    decided_by_rank_zero(claim)
    try:
        config, saved, data = _prepare(with_absolute_paths(dataclasses.replace(given, output_dir=str(output))),
                                       explicit)
    except BaseException:
        if isinstance(lock, RunFolderLock):
            lock.release(discard=True)
        raise
    return config, saved, data, lock


def _output_folder(given: RunConfig, explicit: set[str]) -> Path:
    """--output-dir; else the run folder of --resume; else a new runs/<mode>-<time>."""
    if given.resume == AUTO and "output_dir" not in explicit:
        raise UsageError("--resume auto resumes the run in --output-dir, or starts it there: give --output-dir "
                         "(e.g. --output-dir runs/my-run --resume auto)")
    if given.output_dir is not None:
        output = Path(given.output_dir)
    elif given.resume is not None:
        if not Path(given.resume).exists():
            raise CheckpointError(f"checkpoint {given.resume!r} does not exist; give a checkpoint file or a run "
                                  "folder holding last.pt")
        output = run_folder_of(given.resume)
    else:
        output = Path("runs") / f"{given.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output-dir {output} exists and is not a folder; choose another path")
    return output


def _prepare(given: RunConfig, explicit: set[str]) -> tuple[RunConfig, RunCheckpoint | None, Splits]:
    found = choose_checkpoint(given.resume, given.output_dir) if given.resume is not None else None
    saved = found.chosen if found is not None else None
    mode = mode_of(given)
    if saved is None:  # a new run: the defaults of its kind where the options were not given
        given = dataclasses.replace(given, **{name: value for name, value in mode.kind_defaults.items()
                                              if name not in explicit})
    config = merge_resume(given, explicit, saved) if saved is not None else dataclasses.replace(given, resume=None)
    mode = mode_of(config)
    if config.steps is None and config.epochs is None:
        config = dataclasses.replace(config, epochs=mode.default_epochs)
    config = run_settings(config)  # the --deepspeed file's contents, kept in the run; a resume compares them
    check_options(config)
    if saved is None:  # a resume's heads were trained: only a new run can start one at random
        for message in mode.random_heads(config):
            warnings.warn(message, stacklevel=2)
    output = Path(config.output_dir)
    if given.resume is None and any((output / name).exists() for name in RUN_FILES):
        raise UsageError(f"--output-dir {output} already holds a run; pass --resume {output} to continue it, "
                         "--resume auto to continue it or, if it saved no checkpoint, start it afresh there, or "
                         "choose another --output-dir")
    startup_phase(config.mode, f"reading the data (--data {config.data})", not config.quiet and distributed.rank() == 0)
    with reading_data(config.data, config.eval_data):
        data = mode.load_data(config)
    check_bad_share(data.train.skipped, len(data.train) + len(data.test), config.max_bad_share, mode.items)
    config = mode.resolve(config, data)
    if len(data.train) < config.batch_size:
        damaged = getattr(data.train, "damaged", [])  # streamed files the count could not read to their end
        counted = (f", counted up to the damage of {'; '.join(damaged)}; repair or replace "
                   f"{'it' if len(damaged) == 1 else 'them'}," if damaged else ";")
        held = (f" (--test-size {config.test_size if config.test_size is not None else 'by default'} held out "
                f"{len(data.test)} of --data's {mode.items})" if config.eval_data is None else "")
        fix = "a smaller --test-size, " if config.eval_data is None else ""
        raise UsageError(f"--batch-size {config.batch_size} exceeds the {len(data.train)} training {mode.items}"
                         f"{held}{counted} pass a smaller --batch-size, {fix}or use more data")
    if saved is not None:
        check_length(config, saved, len(data.train))
    if distributed.rank() == 0:  # every check passed
        if saved is not None:
            found.set_aside()  # the damaged newest goes aside, the next save keeps `saved`
        mode.save_data_index(config, data)  # a disk too full for it fails here: the lock discards a new folder
    return config, saved, data


def check_options(config: RunConfig) -> None:
    """Refuse option values that cannot work, naming the option, the value and the fix: every number finite
    (NaN and infinity refused), every field in the range its `option(...)` metadata gives, the options the library
    checks refused by its own checks, then the combinations, the mode's own checks and the model."""
    for option in dataclasses.fields(config):
        value = getattr(config, option.name)
        if isinstance(value, float) and not is_finite(value):
            raise UsageError(f"--{_dashed(option.name)} must be a finite number, got {value}")
        if not option.metadata.get("modes") or config.mode in option.metadata["modes"]:
            _check_range(option, value)
    _check_with_library(config)
    world_size = distributed.world_size()
    if config.batch_size % world_size:
        raise UsageError(f"--batch-size {config.batch_size} is not divisible by the {world_size} processes; "
                         f"use a multiple of {world_size}")
    local = config.batch_size // world_size
    if config.strategy == "naive" and local % min(config.chunk_size, local):
        raise UsageError(f"--strategy naive needs the per-process batch ({local}) divisible by --chunk-size "
                         f"{config.chunk_size}, so every micro-batch has the same negatives; e.g. --chunk-size "
                         f"{_divisor_below(local, config.chunk_size)}")
    if config.queue_size and config.fsdp:
        raise UsageError("--queue-size with --fsdp: the sharded checkpoint cannot load a queue sized on the first "
                         "step yet; drop --fsdp (DDP keeps the queue) or --queue-size")
    check_device(config.device, world_size, local_rank())
    mode_of(config).check(config)
    mode_of(config).check_model(config)  # after the plain values: it may load a model folder
    _check_builds(config)
    check_memory(config)
    if config.matryoshka_dims is not None:  # after the model: its width may come from its folder
        check_dims(config.matryoshka_dims, mode_of(config).embedding_width(config))
    _check_deepspeed(config)  # before --fsdp's and adamw8bit's own checks: it names the combination
    _check_sharding(config)
    check_report_to(config.report_to)
    check_compile(config)


def _check_builds(config: RunConfig) -> None:
    """A model built from the options alone (a gradcache.models preset, not a folder or open_clip) builds, and its
    weights fit in the memory of --device: its shapes are built on the meta device, which allocates nothing, so a
    constructor's refusal (a text width its heads do not divide, a size past what a tensor can hold) and a model
    too large to hold name the options before anything is written."""
    if config.model not in IMAGE_ENCODER_PRESETS:
        return
    options = [name for name in MODEL_FIELDS if name not in ("mode", "model") and _applies(config, name)]
    changed = [name for name in options if getattr(config, name) != RunConfig.__dataclass_fields__[name].default]
    given = " ".join(f"--{_dashed(name)} {getattr(config, name)}" for name in changed or options)
    try:
        with torch.device("meta"):
            model = mode_of(config).build_model(config)
    except (ValueError, TypeError, RuntimeError, OverflowError) as error:  # TypeError, RuntimeError: torch's sizes
        reason = str(error).splitlines()[0]
        raise UsageError(f"{given} (the model options of --model {config.model}) build no model: {reason} Change "
                         "the option it names") from error
    weights, memory = sum(p.numel() * p.element_size() for p in model.parameters()), _memory_bytes(config.device)
    if weights > memory:
        raise UsageError(f"{given} (the model options of --model {config.model}) build a model of "
                         f"{_gibibytes(weights)} of weights, more than the {_gibibytes(memory)} of --device "
                         f"{config.device}; choose smaller widths")


def check_memory(config: RunConfig) -> None:
    """The values that allocate in proportion to their size, against the memory of the machine (CPU) or of the
    --device (a GPU): one batch of --batch-size images of 3 x --image-size^2 float32 (and, for built-in data, its
    --train-size + --test-size images of 3 x --image-size^2 bytes), and the queue of --queue-size embeddings. A
    value that cannot fit is refused with the largest one that might; one that fits may still not, with the model."""
    memory = _memory_bytes(config.device)
    if _applies(config, "image_size"):
        pixels, count = 3 * config.image_size ** 2, config.train_size + held_out_size(config.test_size, None, "images")
        images = [(config.batch_size * pixels * 4, f"one batch of --batch-size {config.batch_size} images of 3 x "
                   f"{config.image_size} x {config.image_size} float32", config.batch_size * 12)]
        if config.data in BUILT_IN_DATA:
            images.append((count * pixels, f"the built-in --data {config.data}'s --train-size + --test-size, {count} "
                           f"images of 3 x {config.image_size} x {config.image_size} bytes,", count * 3))
        largest = min(math.isqrt(memory // per_squared_pixel) for _, _, per_squared_pixel in images)
        for needed, what, _ in images:
            if needed > memory:
                raise UsageError(f"--image-size {config.image_size}: {what} would take {_gibibytes(needed)}, more "
                                 f"than the {_gibibytes(memory)} of memory here; use --image-size at most {largest}")
    if config.queue_size > 0:
        width = mode_of(config).embedding_width(config)
        size = 2 if config.precision in ("fp16", "bf16") else 4
        needed = config.queue_size * width * size
        if needed > memory:
            raise UsageError(f"--queue-size {config.queue_size}: a queue of that many embeddings of {width} numbers "
                             f"would take {_gibibytes(needed)}, more than the {_gibibytes(memory)} of memory of "
                             f"--device {config.device}; use --queue-size at most {memory // (width * size)} (a "
                             "few times --batch-size is usual)")


def _memory_bytes(device: str) -> int:
    """The memory of `device`: a GPU's own, else the machine's physical memory."""
    parsed = torch.device(device)
    if parsed.type == "cuda":  # `cuda` alone: the current GPU, this rank's under torchrun (placement.device_of)
        index = parsed.index if parsed.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gibibytes(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def _applies(config: RunConfig, name: str) -> bool:
    modes = RunConfig.__dataclass_fields__[name].metadata.get("modes")
    return not modes or config.mode in modes


def _check_range(option: dataclasses.Field, value: object) -> None:
    """`value` within the bounds of `option`'s metadata (`at_least`, `above`, `at_most`, `below`), if it has any
    and the value is set."""
    meta = option.metadata
    if value is None or within(value, at_least=meta.get("at_least"), above=meta.get("above"),
                               at_most=meta.get("at_most"), below=meta.get("below")):
        return
    low = ("[", meta["at_least"]) if meta.get("at_least") is not None else ("(", meta.get("above"))
    high = ("]", meta["at_most"]) if meta.get("at_most") is not None else (")", meta.get("below"))
    if low[1] is not None and high[1] is not None:
        rule = f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    elif low[1] is not None:
        rule = f"at least {low[1]}" if low[0] == "[" else f"greater than {low[1]}"
    else:
        rule = f"at most {high[1]}" if high[0] == "]" else f"less than {high[1]}"
    why = f" ({meta['why']})" if meta.get("why") else ""
    raise UsageError(f"--{_dashed(option.name)} {value}: must be {rule}{why}")


def _check_with_library(config: RunConfig) -> None:
    """The options the library checks, by the library's own checks: the loss's temperature, tiles and queue, the
    strategy's memory_budget and chunk_tokens, and whether `--strategy` takes chunk_tokens at all."""
    _refused_by_library(lambda: check_temperature(config.temperature, "--temperature"))
    _refused_by_library(lambda: check_tile_size(config.tile_size), f"--tile-size {config.tile_size}: ")
    _refused_by_library(lambda: check_queue_options(config.queue_size, config.queue_warmup),
                        f"--queue-size {config.queue_size} --queue-warmup {config.queue_warmup}: ")
    _refused_by_library(lambda: check_memory_budget(config.memory_budget, "--memory-budget"))
    _refused_by_library(lambda: check_chunk_tokens(config.chunk_tokens, "--chunk-tokens"))
    if config.chunk_tokens is not None:  # the run's strategy, built as the run builds it, on stand-in encoders
        _refused_by_library(lambda: build_strategy(config, nn.Identity(), _no_loss, None,
                                                   mode_of(config).trim_padding),
                            f"--chunk-tokens does not apply to --strategy {config.strategy}: ")


def _refused_by_library(check: Callable[[], object], given: str = "") -> None:
    """Run `check`, one of the library's own; its TypeError or ValueError becomes a UsageError (exit status 2),
    after `given`: the flags and values checked, where the library's message names its own parameter."""
    try:
        check()
    except (TypeError, ValueError) as error:
        raise UsageError(f"{given}{error}") from error


def _no_loss(*embeddings: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("a stand-in: preflight builds a strategy to check its options, never steps it")


def _check_sharding(config: RunConfig) -> None:
    """--cpu-offload needs --fsdp; 8-bit AdamW needs bitsandbytes with a backend for --device, and plain
    (unsharded) parameters."""
    if config.cpu_offload and not config.fsdp:
        raise UsageError("--cpu-offload moves FSDP shards to CPU memory and needs --fsdp; add --fsdp or drop "
                         "--cpu-offload")
    if config.optimizer != "adamw8bit":
        return
    if config.fsdp:
        raise UsageError("--optimizer adamw8bit cannot step parameters sharded by --fsdp (bitsandbytes reads plain "
                         "tensors); use --optimizer adamw with --fsdp (and --cpu-offload to move its state to CPU "
                         "memory), or adamw8bit without --fsdp")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise UsageError("--optimizer adamw8bit needs bitsandbytes: pip install bitsandbytes (or choose "
                         "--optimizer adamw)") from error
    from gradcache.train.optim.adamw8bit import (
        check_8bit_adamw,  # bitsandbytes: only when asked
    )

    try:
        check_8bit_adamw(config.device)
    except RuntimeError as error:
        raise UsageError(str(error)) from error


def _check_deepspeed(config: RunConfig) -> None:
    """--deepspeed: deepspeed installed, its config file one the program trains exactly
    (gradcache/train/parallel/deepspeed.py), and the options beside it that an engine over one encoder allows."""
    if config.deepspeed is None:
        return
    for given, why in ((config.fsdp, "--fsdp: both shard the model; choose one (ZeRO-3 shards parameters too)"),
                       (mode_of(config).deepspeed_refusal is not None, mode_of(config).deepspeed_refusal),
                       (config.separate_towers, "--separate-towers: the program hands DeepSpeed one encoder and its "
                        "optimizer; share the tower or use --fsdp or DDP"),
                       (config.optimizer == "adamw8bit", "--optimizer adamw8bit: ZeRO steps flattened partitions, "
                        "which bitsandbytes does not read; use --optimizer adamw (ZeRO's offload_optimizer moves its "
                        "state to CPU memory)"),
                       (config.optimizer in ("lars", "lamb"), f"--optimizer {config.optimizer}: ZeRO steps "
                        "flattened partitions holding pieces of several parameters, so a layer-wise trust ratio "
                        "would be taken over the wrong norms; use --optimizer adamw or sgd, or DDP or --fsdp"),
                       (config.precision == "fp16", "--precision fp16: a gradient scaler's scale does not reach "
                        "ZeRO's partitions; use --precision bf16 or fp32")):
        if given:
            raise UsageError(f"--deepspeed cannot run with {why}")
    if importlib.util.find_spec("deepspeed") is None:
        raise UsageError('--deepspeed needs deepspeed: pip install -e ".[deepspeed]"')
    from gradcache.train.parallel.deepspeed import check_program_config, deepspeed_config

    check_program_config(deepspeed_config(config.deepspeed, config.batch_size, distributed.world_size(),
                                          config.deepspeed_settings), config.deepspeed)


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _divisor_below(number: int, limit: int) -> int:
    return max(d for d in range(1, min(number, limit) + 1) if number % d == 0)
