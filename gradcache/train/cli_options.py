"""The options of `gradcache train simclr|clip`, their checks, and how `--resume` merges them with a checkpoint.

Everything here runs before a run writes anything: a bad option, unusable data, a checkpoint from another model
or an output folder that already holds a run raises `UsageError`/`DataError`/`CheckpointError` (exit status 2).

On `--resume` the run's options come from the checkpoint, so the resumed run is the run that was interrupted.
Only the run-local options (`RUN_LOCAL`) may be given anew; any other option given on the command line must
equal the checkpoint's, or the resume is refused, naming the option.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from gradcache.train.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from gradcache.train.image_set import DataSplits
from gradcache.train.optim import LR_SCALINGS, OPTIMIZERS
from gradcache.train.recipe import PRECISIONS, STRATEGIES, build_model, load_data, model_signature

# --cpu-offload only moves where the shards live, so a resumed run may turn it on or off.
RUN_LOCAL = {"device", "output_dir", "quiet", "workers", "threads", "resume", "checkpoint_every", "eval_every",
             "cpu_offload"}

# Per-mode defaults: the SimCLR ones are the tuned default run (`gradcache train`, a few CPU minutes).
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "simclr": dict(temperature=0.1, lr=2e-3, steps=None, batch_size=128, chunk_size=32, train_size=8192,
                   test_size=2048, projection_dim=128),
    "clip": dict(temperature=0.07, lr=2e-3, steps=None, batch_size=256, chunk_size=64, train_size=8192,
                 test_size=2048, projection_dim=128),
}
DEFAULT_EPOCHS = {"simclr": 6, "clip": 4}


class UsageError(ValueError):
    """An option value that cannot work; the message names the option, the value and the fix."""


def add_train_options(parser: argparse.ArgumentParser, mode: str) -> None:
    """Every option of `gradcache train <mode>`; help strings show the defaults."""
    d = MODE_DEFAULTS[mode]
    data = parser.add_argument_group("data")
    data.add_argument("--data", default="shapes", help="'shapes' (built-in, procedural), 'digits' (scikit-learn) or "
                      + ("an ImageFolder root" if mode == "simclr" else "a CSV/TSV of image paths and captions"))
    data.add_argument("--image-size", type=int, default=32, help="images are decoded or rendered at this side")
    data.add_argument("--train-size", type=int, default=d["train_size"], help="built-in shapes: training images")
    data.add_argument("--test-size", type=int, default=d["test_size"], help="images held out for evaluation")
    data.add_argument("--data-seed", type=int, default=0, help="seed of the built-in data and the held-out split")
    if mode == "clip":
        data.add_argument("--csv-image-key", default="filepath", help="CSV column holding image paths")
        data.add_argument("--csv-caption-key", default="title", help="CSV column holding captions")
        data.add_argument("--csv-separator", default=None, help="CSV separator (default: tab for .tsv, else comma)")
    else:
        data.add_argument("--crop-min-scale", type=float, default=0.5, help="smallest area of the random crop")
        data.add_argument("--jitter-strength", type=float, default=0.5, help="colour jitter strength s (SimCLR: "
                          "brightness, contrast, saturation 0.8 s, hue 0.2 s)")
        data.add_argument("--channel-permutation", type=float, default=0.5, help="chance of permuting the RGB "
                          "channels of a view (breaks colour relations that hue jitter keeps)")
        data.add_argument("--rotation", type=float, default=0.0, help="largest random rotation of a view in "
                          "degrees, corners filled by reflection (for data whose classes survive rotation)")
    data.add_argument("--workers", type=int, default=1, help="data loader worker processes (0: in the main one); "
                      "augmenting in a worker overlaps it with the encoders")
    data.add_argument("--threads", type=int, default=None, help="torch threads of the training process on CPU "
                      "(default: CPU cores minus --workers, at least 1)")

    model = parser.add_argument_group("model")
    model.add_argument("--model", default="convnet", choices=["convnet", "resnet18", "resnet34", "resnet50",
                                                               "vit_tiny"], help="image encoder")
    model.add_argument("--width", type=int, default=16, help="convnet: channels of the first stage")
    model.add_argument("--norm", default="group", choices=["group", "batch"], help="convnet/resnet normalisation "
                       "(group: per-example, exact under gradcache; the convnet standardises its conv weights with it; "
                       "batch: per-chunk statistics under gradcache/naive)")
    model.add_argument("--projection-dim", type=int, default=d["projection_dim"], help="embedding size of the loss")
    if mode == "simclr":
        model.add_argument("--hidden-dim", type=int, default=512, help="projection head hidden width")
    else:
        model.add_argument("--context-length", type=int, default=96, help="most tokens per caption")
        model.add_argument("--text-width", type=int, default=128, help="text transformer width")
        model.add_argument("--text-layers", type=int, default=2, help="text transformer layers")
        model.add_argument("--text-heads", type=int, default=4, help="text transformer attention heads")
    model.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward")

    run = parser.add_argument_group("optimisation")
    run.add_argument("--strategy", default="gradcache", choices=list(STRATEGIES),
                     help="gradcache: exact full-batch gradient in chunks; naive: accumulation (negatives only "
                          "within a chunk); full: one pass over the whole batch (ignores --chunk-size)")
    run.add_argument("--batch-size", type=int, default=d["batch_size"],
                     help="global contrastive batch over all ranks (negatives follow from it)")
    run.add_argument("--chunk-size", type=int, default=d["chunk_size"],
                     help="examples per encoder pass (larger than the batch: one chunk)")
    run.add_argument("--tile-size", type=int, default=None, help="compute the loss in tiles of this many rows "
                     "(None: dense)")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None, help=f"passes over the training data (default "
                        f"{DEFAULT_EPOCHS[mode]} when --steps is not given)")
    length.add_argument("--steps", type=int, default=d["steps"], help="optimizer steps (overrides --epochs)")
    run.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZERS), help="lars/lamb: for large batches")
    run.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate at --base-batch-size")
    run.add_argument("--lr-scaling", default="sqrt", choices=list(LR_SCALINGS),
                     help="scale --lr by (batch / base batch) (linear) or its square root (sqrt)")
    run.add_argument("--base-batch-size", type=int, default=256, help="the batch size --lr is stated for")
    run.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then cosine decay to 0")
    run.add_argument("--weight-decay", type=float, default=1e-4, help="on weights, not on biases or norms")
    run.add_argument("--momentum", type=float, default=0.9, help="sgd/lars momentum")
    run.add_argument("--temperature", type=float, default=d["temperature"],
                     help="loss temperature" + (" (initial; learned)" if mode == "clip" else ""))
    if mode == "clip":
        run.add_argument("--max-logit-scale", type=float, default=100.0, help="clamp of 1/temperature after each step")
    run.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                     help="encoders under autocast in bf16/fp16 (fp16 with a gradient scaler)")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    shard = parser.add_argument_group("sharding (torchrun)")
    shard.add_argument("--fsdp", action="store_true", help="shard each encoder block by block with FSDP2 instead "
                       "of DDP; checkpoints become last.dcp (one shard per rank, resumable on any number of ranks); "
                       "without torchrun, a one-process gloo group is started")
    shard.add_argument("--fsdp-reduce", default="chunk", choices=["chunk", "step"], help="--fsdp: reduce-scatter "
                       "gradients after every chunk (chunk: sharded gradients) or once per step (step: whole "
                       "gradients between chunks, fewer collectives)")
    shard.add_argument("--cpu-offload", action="store_true", help="--fsdp: keep sharded parameters, gradients "
                       "and optimizer state in CPU memory; the optimizer steps on CPU")
    run.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and augmentation")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", default=None, help="run folder (default: runs/<mode>-<time>; "
                        "on --resume: the checkpoint's folder)")
    output.add_argument("--resume", default=None, help="continue from this checkpoint (or run folder)")
    output.add_argument("--checkpoint-every", type=int, default=100, help="save last.pt every N steps and at the end")
    output.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: at start and end)")
    output.add_argument("--knn-k", type=int, default=200, help="kNN evaluation: neighbours")
    output.add_argument("--knn-temperature", type=float, default=0.1, help="kNN evaluation: vote temperature")
    output.add_argument("--quiet", action="store_true", help="no progress bar")


def explicit_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The `dest` of every train option that `argv` spells out (abbreviations are disabled, so this is exact)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_train_options(probe, argv[1] if len(argv) > 1 and argv[1] in MODE_DEFAULTS else "simclr")
    given = set()
    for action in probe._actions:
        if any(token == option or token.startswith(option + "=") for token in argv for option in action.option_strings):
            given.add(action.dest)
    return given


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def check_options(args: argparse.Namespace) -> None:
    """Refuse option values that cannot work, naming the option, the value and the fix."""
    _positive(args, "threads", "batch_size", "chunk_size", "steps", "epochs", "image_size", "train_size", "test_size",
              "checkpoint_every", "knn_k", "base_batch_size", "width", "projection_dim")
    if args.tile_size is not None and args.tile_size < 1:
        raise UsageError(f"--tile-size must be at least 1 (or omitted for the dense loss), got {args.tile_size}")
    if args.batch_size < 2:
        raise UsageError(f"--batch-size {args.batch_size}: a contrastive batch needs at least 2 examples")
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if args.batch_size % world_size:
        raise UsageError(f"--batch-size {args.batch_size} is not divisible by the {world_size} processes; "
                         f"use a multiple of {world_size}")
    local = args.batch_size // world_size
    if args.strategy == "naive" and local % min(args.chunk_size, local):
        raise UsageError(f"--strategy naive needs the per-process batch ({local}) divisible by --chunk-size "
                         f"{args.chunk_size}, so every micro-batch has the same negatives; e.g. --chunk-size "
                         f"{_divisor_below(local, args.chunk_size)}")
    for name in ("lr", "temperature", "knn_temperature"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warmup < 0 or args.weight_decay < 0 or args.workers < 0 or args.eval_every < 0:
        raise UsageError("--warmup, --weight-decay, --workers and --eval-every must not be negative")
    if args.mode == "simclr" and not 0 < args.crop_min_scale <= 1:
        raise UsageError(f"--crop-min-scale must be in (0, 1], got {args.crop_min_scale}")
    if args.mode == "simclr" and not 0 <= args.channel_permutation <= 1:
        raise UsageError(f"--channel-permutation is a probability in [0, 1], got {args.channel_permutation}")
    if args.mode == "simclr" and not 0 <= args.jitter_strength <= 2.5:
        raise UsageError(f"--jitter-strength must be in [0, 2.5] (hue shift 0.2 s at most 0.5), got "
                         f"{args.jitter_strength}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available here; use --device cpu")
    _check_sharding(args)
    if args.model == "vit_tiny" and args.image_size % 4:
        raise UsageError(f"--model vit_tiny needs --image-size divisible by its patch size 4, got {args.image_size}")


def _check_sharding(args: argparse.Namespace) -> None:
    """--cpu-offload needs --fsdp; 8-bit AdamW needs bitsandbytes with a backend for --device, and plain
    (unsharded) parameters."""
    if args.cpu_offload and not args.fsdp:
        raise UsageError("--cpu-offload moves FSDP shards to CPU memory and needs --fsdp; add --fsdp or drop "
                         "--cpu-offload")
    if args.optimizer != "adamw8bit":
        return
    if args.fsdp:
        raise UsageError("--optimizer adamw8bit cannot step parameters sharded by --fsdp (bitsandbytes reads plain "
                         "tensors); use --optimizer adamw with --fsdp (and --cpu-offload to move its state to CPU "
                         "memory), or adamw8bit without --fsdp")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise UsageError("--optimizer adamw8bit needs bitsandbytes: pip install bitsandbytes (or choose "
                         "--optimizer adamw)") from error
    from gradcache.train.fsdp import check_8bit_adamw  # imports torch.distributed.checkpoint: only when asked

    try:
        check_8bit_adamw(args.device)
    except RuntimeError as error:
        raise UsageError(str(error)) from error


def _divisor_below(number: int, limit: int) -> int:
    return max(d for d in range(1, min(number, limit) + 1) if number % d == 0)


def _merge_resume(args: argparse.Namespace, explicit: set[str]) -> tuple[argparse.Namespace, dict]:
    """The checkpoint's options, with the run-local ones taken from the command line; mismatches refused."""
    sharded = sharded_checkpoint(args.resume)
    if sharded is not None:
        from gradcache.train.fsdp import sharded_extra  # torch.distributed.checkpoint: only for these runs

        checkpoint = {**sharded_extra(sharded), "sharded": str(sharded)}  # the shards load once sharding is set up
        if "args" not in checkpoint:
            raise CheckpointError(f"--resume {args.resume} is a sharded checkpoint without the run's options; "
                                  "it was not written by gradcache train")
    else:
        checkpoint = load_checkpoint(args.resume)
    if "fsdp" in explicit and sharded is None:
        raise CheckpointError(f"--resume {args.resume} is a single-file checkpoint (last.pt) of a run without "
                              "--fsdp; resume it without --fsdp, or start a new run with --fsdp")
    stored = checkpoint["args"]
    if stored.get("mode") != args.mode:
        raise CheckpointError(f"{args.resume} is a {stored.get('mode')} checkpoint; resume it with "
                              f"`gradcache train {stored.get('mode')} --resume ...`")
    signature = model_signature(args)
    for key in sorted(explicit - RUN_LOCAL):
        if key in stored and stored[key] != getattr(args, key):
            kind = "a different model" if key in signature else "a run with different options"
            raise CheckpointError(f"--resume {args.resume} holds {kind}: it was trained with "
                                  f"--{key.replace('_', '-')} {stored[key]!r}, this command gives "
                                  f"{getattr(args, key)!r}; drop the option to resume, or start a new run")
    merged = argparse.Namespace(**{**vars(args), **stored})
    for key in RUN_LOCAL:
        setattr(merged, key, getattr(args, key))
    if merged.output_dir is None:
        merged.output_dir = str((sharded or resolve_checkpoint(args.resume)).parent)
    if sharded is not None and not merged.fsdp:
        raise CheckpointError(f"--resume {args.resume} is a sharded checkpoint but its run has no --fsdp; "
                              "it was not written by gradcache train")
    if sharded is not None:
        return merged, checkpoint  # the parameter names are checked by load_sharded before anything is written
    try:  # a checkpoint of an older or foreign model fails here, before anything is written
        build_model(merged).load_state_dict(checkpoint["model"])
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        raise CheckpointError(f"--resume {args.resume} does not fit the model it names: {error}") from error
    return merged, checkpoint


def sharded_checkpoint(path: str) -> Path | None:
    """The `last.dcp` folder that `path` names (the folder itself, or a run folder holding it), else None."""
    path = Path(path)
    for candidate in (path, path / "last.dcp", path / "last.dcp.old"):  # .old: a save stopped between renames
        if candidate.is_dir() and (candidate / ".metadata").is_file():
            return path / "last.dcp" if candidate.name == "last.dcp.old" else candidate
    return None


def resolve_run_options(args: argparse.Namespace,
                        explicit: set[str]) -> tuple[argparse.Namespace, dict | None, DataSplits]:
    """Check the options, merge a resume checkpoint, pick the output folder and load the data; write nothing."""
    checkpoint = None
    if args.resume is not None:
        args, checkpoint = _merge_resume(args, explicit)
    if args.steps is None and args.epochs is None:
        args.epochs = DEFAULT_EPOCHS[args.mode]
    check_options(args)
    if args.output_dir is None:
        args.output_dir = str(Path("runs") / f"{args.mode}-{time.strftime('%Y%m%d-%H%M%S')}")
    output = Path(args.output_dir)
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output-dir {output} exists and is not a folder; choose another path")
    if checkpoint is None and any((output / name).exists() for name in ("last.pt", "last.dcp", "train_log.csv")):
        raise UsageError(f"--output-dir {output} already holds a run; pass --resume {output} to continue it, "
                         "or choose another --output-dir")
    data = load_data(args)
    if len(data.train) < args.batch_size:
        raise UsageError(f"--batch-size {args.batch_size} exceeds the {len(data.train)} training images; "
                         "pass a smaller --batch-size or use more data")
    if args.mode == "clip" and data.train.captions is None:
        raise UsageError(f"--data {args.data} has no captions; CLIP needs image-caption pairs")
    return args, checkpoint, data
