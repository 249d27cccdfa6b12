"""Image encoders by name for the training program: a dict of dataclass presets, not an if-ladder."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Union

from torch import nn

from gradcache.models.convnet import ConvNet
from gradcache.models.resnet import ResNetEncoder
from gradcache.models.vit import ViTEncoder


@dataclass(frozen=True)
class ConvNetConfig:
    width: int = 32  # channels of the first stage; out_dim = 8 * width
    norm: str = "group"  # "group" keeps per-example features independent of chunking; or "batch"
    in_channels: int = 3
    groups: int = 8  # GroupNorm groups; must divide width

    def build(self) -> nn.Module:
        return ConvNet(**asdict(self))


@dataclass(frozen=True)
class ResNetConfig:
    depth: int = 18  # 18, 34 or 50; out_dim 512, 512, 2048
    small_stem: bool = False  # 3x3 stride-1 stem without max-pool, for 32x32 inputs
    norm: str = "batch"
    groups: int = 32  # GroupNorm groups, used only with norm="group"

    def build(self) -> nn.Module:
        return ResNetEncoder(**asdict(self))


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 32  # must match the images; divisible by patch_size
    patch_size: int = 4  # 32 / 4 = 8x8 = 64 tokens plus the class token
    width: int = 192  # out_dim
    layers: int = 6
    heads: int = 3
    mlp_ratio: int = 4  # MLP hidden size = mlp_ratio * width

    def build(self) -> nn.Module:
        return ViTEncoder(**asdict(self))


EncoderConfig = Union[ConvNetConfig, ResNetConfig, ViTConfig]

IMAGE_ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "convnet": ConvNetConfig(),
    "resnet18": ResNetConfig(depth=18),
    "resnet34": ResNetConfig(depth=34),
    "resnet50": ResNetConfig(depth=50),
    "vit_tiny": ViTConfig(),
}


def build_image_encoder(name: str, **kwargs: Any) -> nn.Module:
    """Preset ``name`` with the fields in ``kwargs`` overridden -> a randomly initialised image encoder.

    Every encoder returned maps images (B, C, H, W) to (B, encoder.out_dim) and has
    ``set_grad_checkpointing``. The fields a preset accepts are those of its config dataclass.

    Raises:
        ValueError: unknown ``name`` (the message lists the valid names), or a bad field value.
        TypeError: a keyword that is not a field of that preset's config.

    Example:
        >>> build_image_encoder("resnet18", small_stem=True, norm="group").out_dim
        512
    """
    if name not in IMAGE_ENCODER_PRESETS:
        raise ValueError(f"unknown image encoder {name!r}; choose one of {sorted(IMAGE_ENCODER_PRESETS)}.")
    preset = IMAGE_ENCODER_PRESETS[name]
    valid = [field.name for field in fields(preset)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(f"image encoder {name!r} does not take {unknown}; its options are {valid}.")
    return replace(preset, **kwargs).build()
