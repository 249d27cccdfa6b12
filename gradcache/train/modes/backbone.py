"""The image encoder of every mode: the `--model` preset of gradcache.models, with the options it takes.

Options go by the preset's config class, not its name, so a new preset in
`gradcache.models.IMAGE_ENCODER_PRESETS` of an existing class (another ResNet depth, a wider ViT) needs no
change here.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from gradcache.models import (
    IMAGE_ENCODER_PRESETS,
    ConvNetConfig,
    ResNetConfig,
    ViTConfig,
    build_image_encoder,
)
from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError
from gradcache.train.modes.patches import check_patches_tile

CONVNET_MIN_IMAGE_SIZE = 8  # its three 2 x 2 max-pools leave 1 x 1 of an 8 x 8 image
BACKBONE_HELP = f"image encoder: a preset of gradcache.models ({', '.join(IMAGE_ENCODER_PRESETS)})"


def backbone_options(config: RunConfig) -> dict[str, Any]:
    """The command-line options that the `--model` preset's config takes."""
    preset = IMAGE_ENCODER_PRESETS[config.model]
    if isinstance(preset, ConvNetConfig):
        return dict(width=config.width, norm=config.norm)
    if isinstance(preset, ResNetConfig):
        return dict(norm=config.norm, small_stem=config.image_size <= 64)
    if isinstance(preset, ViTConfig):
        return dict(image_size=config.image_size)
    return {}


def build_backbone(config: RunConfig) -> nn.Module:
    """A randomly initialised `--model` encoder, images (B, 3, H, W) -> (B, out_dim)."""
    return build_image_encoder(config.model, **backbone_options(config))


def check_backbone(config: RunConfig) -> None:
    """`--model` names a preset, and the images suit it (a ViT's patches tile them)."""
    preset = IMAGE_ENCODER_PRESETS.get(config.model)
    if preset is None:
        raise UsageError(f"--model {config.model!r} is not an image encoder preset; choose one of "
                         f"{', '.join(IMAGE_ENCODER_PRESETS)}")
    if isinstance(preset, ConvNetConfig) and config.norm == "group" and config.width % preset.groups:
        raise UsageError(f"--width {config.width} with --norm group: GroupNorm splits every layer's channels into "
                         f"{preset.groups} groups, so --width must be a multiple of {preset.groups}; use --width "
                         f"{max(preset.groups, config.width - config.width % preset.groups)}, or --norm batch")
    if isinstance(preset, ConvNetConfig) and config.image_size < CONVNET_MIN_IMAGE_SIZE:
        raise UsageError(f"--model {config.model} halves the image three times and needs --image-size at least "
                         f"{CONVNET_MIN_IMAGE_SIZE}, got {config.image_size}")
    if isinstance(preset, ViTConfig):
        check_patches_tile(config.model, config.image_size, preset.patch_size)
