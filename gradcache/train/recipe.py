"""What a run is made of, built from its arguments: the data, the model, the loss, the tokenizer, the strategy.

The same functions rebuild a run from the arguments stored in its checkpoint (`gradcache eval`, `--resume`), so a
checkpoint needs no code beside it. `args` is the namespace of `gradcache train simclr|clip` (see `cli.py`).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import gradcache
from gradcache import losses
from gradcache.train.datasets import DataError, load_caption_table, load_digits, load_image_folder
from gradcache.train.image_set import DataSplits
from gradcache.train.shapes import load_shapes

STRATEGIES: dict[str, type] = {
    "gradcache": gradcache.GradCache,
    "naive": gradcache.NaiveAccumulation,
    "full": gradcache.FullBatch,
}
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
BUILT_IN_DATA = ("shapes", "digits")


def load_data(args: argparse.Namespace) -> DataSplits:
    """`shapes`, `digits`, an ImageFolder root (simclr) or a CSV/TSV of image paths and captions (clip)."""
    if args.data == "shapes":
        return load_shapes(args.train_size, args.test_size, args.image_size, args.data_seed)
    if args.data == "digits":
        return load_digits(args.image_size, args.test_size, args.data_seed)
    path = Path(args.data)
    if not path.exists():
        raise DataError(f"--data {args.data!r} does not exist; give {' or '.join(BUILT_IN_DATA)}, "
                        + ("an ImageFolder root" if args.mode == "simclr" else "a CSV/TSV of image paths and captions"))
    if args.mode == "simclr":
        return load_image_folder(path, args.image_size, args.test_size, args.data_seed)
    return load_caption_table(path, args.image_size, args.test_size, args.data_seed, image_key=args.csv_image_key,
                              caption_key=args.csv_caption_key, separator=args.csv_separator)


def build_image_encoder(args: argparse.Namespace) -> nn.Module:
    """The `--model` backbone, with the options that preset takes."""
    from gradcache.models import build_image_encoder as build

    options: dict[str, Callable[[], dict]] = {
        "convnet": lambda: dict(width=args.width, norm=args.norm),
        "vit_tiny": lambda: dict(image_size=args.image_size),
    }
    resnet = lambda: dict(norm=args.norm, small_stem=args.image_size <= 64)  # noqa: E731
    return build(args.model, **options.get(args.model, resnet)())


def build_model(args: argparse.Namespace) -> nn.Module:
    """A freshly initialised SimCLRModel (backbone + projection head) or CLIP (image and text towers)."""
    from gradcache.models import CLIP, ByteTokenizer, ProjectionHead, SimCLRModel, TextEncoder

    backbone = build_image_encoder(args)
    if args.mode == "simclr":
        head = ProjectionHead(backbone.out_dim, hidden_dim=args.hidden_dim, out_dim=args.projection_dim)
        model = SimCLRModel(backbone, head)
    else:
        text = TextEncoder(ByteTokenizer.vocab_size, context_length=args.context_length, width=args.text_width,
                           layers=args.text_layers, heads=args.text_heads)
        model = CLIP(backbone, text, embed_dim=args.projection_dim)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def build_loss(args: argparse.Namespace) -> nn.Module:
    """NT-Xent (SimCLR, fixed temperature) or the CLIP loss (learnable temperature), dense or tiled."""
    if args.mode == "simclr":
        return losses.NTXent(temperature=args.temperature, tile_size=args.tile_size)
    return losses.ClipLoss(temperature=args.temperature, learnable=True, tile_size=args.tile_size)


def build_tokenizer(args: argparse.Namespace) -> Callable | None:
    """The byte tokenizer of CLIP runs; None for SimCLR."""
    from gradcache.models import ByteTokenizer

    return ByteTokenizer(args.context_length) if args.mode == "clip" else None


def encoders_of(model: nn.Module, mode: str) -> nn.Module | list[nn.Module]:
    """What the strategy encodes with: SimCLR's one shared network, or CLIP's two towers."""
    if mode == "simclr":
        return model
    return [model.image_tower, model.text_tower]


def build_strategy(args: argparse.Namespace, encoders: nn.Module | list[nn.Module], loss: nn.Module,
                   scaler: torch.amp.GradScaler | None) -> object:
    """`--strategy` over the encoders; `full` takes the whole batch at once and ignores `--chunk-size`."""
    return STRATEGIES[args.strategy](
        encoders, loss, None if args.strategy == "full" else args.chunk_size,
        trim_padding=args.mode == "clip",  # TextEncoder ignores masked positions, so trimming is exact
        autocast_dtype=PRECISIONS[args.precision], scaler=scaler,
        fsdp_reduce=getattr(args, "fsdp_reduce", "chunk"),  # checkpoints from before --fsdp lack it
    )


def model_signature(args: argparse.Namespace) -> dict:
    """The arguments that fix the shapes of the parameters: a checkpoint resumes only into the same ones."""
    keys = ["mode", "model", "width", "norm", "image_size", "hidden_dim", "projection_dim", "context_length",
            "text_width", "text_layers", "text_heads"]
    return {key: getattr(args, key, None) for key in keys}
