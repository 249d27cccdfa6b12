"""An open_clip architecture as GradCache's two towers, with its tokenizer, preprocessing and temperature, built
without a download (random weights, or a local checkpoint file).

Needs `pip install "gradcache[open-clip]"`.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gradcache.integrations.optional import require
from gradcache.losses import ClipLoss, SigLipLoss
from gradcache.ranges import check_int

open_clip = require("open_clip", "open-clip", "gradcache.integrations.open_clip")


@dataclass
class OpenClipTowers:
    """What `gradcache train clip` needs from an open_clip model."""

    image_tower: nn.Module  # images (B, 3, H, W) -> (B, embed_dim)
    text_tower: nn.Module  # token ids (B, context_length) -> (B, embed_dim)
    tokenizer: Callable[[list[str]], torch.Tensor]  # texts -> (B, context_length) token ids
    preprocess_train: Callable[[Any], torch.Tensor]  # a PIL image -> (3, H, W), with open_clip's augmentation
    preprocess_val: Callable[[Any], torch.Tensor]  # a PIL image -> (3, H, W), resize and centre crop
    loss_fn: ClipLoss | SigLipLoss  # the model's own temperature (and SigLIP bias), learnable: `open_clip_loss`


class _TextTower(nn.Module):
    """The text half of an open_clip model: `model.encode_text` with the image tower and the logit scale
    taken out, so the two towers share no parameter."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(input_ids)


def check_architecture(architecture: str) -> dict[str, Any]:
    """The open_clip config of `architecture`; ValueError when open_clip has no such model, builds a tower from
    the Hugging Face hub, or downloads its tokenizer."""
    config = open_clip.get_model_config(architecture)
    if config is None:
        raise ValueError(
            f"architecture={architecture!r} is not an open_clip architecture; choose one of open_clip.list_models(), "
            "e.g. 'ViT-B-32' or 'ViT-S-32-alt'."
        )
    if "siglip" in architecture.lower() and not config.get("text_cfg", {}).get("hf_tokenizer_name"):
        raise ValueError(
            f"architecture={architecture!r}: open_clip gives any name containing 'siglip' a SentencePiece tokenizer "
            "that it downloads, which this project never does; register the config under a name without 'siglip' "
            "(open_clip.add_model_config) to train it with open_clip's own tokenizer."
        )
    for part in ("text_cfg", "vision_cfg"):
        hub = {k: v for k, v in config.get(part, {}).items() if k in ("hf_model_name", "hf_tokenizer_name")}
        if hub:
            raise ValueError(
                f"architecture={architecture!r} builds its {part.split('_')[0]} tower from the Hugging Face hub "
                f"({hub}), which this project never downloads; choose an architecture with open_clip's own towers."
            )
    return config


def is_siglip(architecture: str) -> bool:
    """Whether open_clip builds `architecture` with a learned logit bias (`init_logit_bias` in its config), that
    is a SigLIP model, trained with the sigmoid loss (open_clip's own training: `--siglip`)."""
    return check_architecture(architecture).get("init_logit_bias") is not None


def open_clip_loss(architecture: str, temperature: float, bias: float | None = None,
                   **options: Any) -> ClipLoss | SigLipLoss:
    """The loss `architecture` trains with, its temperature (and bias) learnable: SigLipLoss for a SigLIP
    architecture (`is_siglip`), at `bias` (None: the architecture's `init_logit_bias`), else ClipLoss.

    Args:
        architecture: an open_clip model name without a hub tower.
        temperature: the initial t > 0 (logit_scale = log(1 / t)).
        bias: SigLIP's initial bias; must be None for a CLIP architecture.
        **options: the loss's other arguments (tile_size, queue_size, queue_warmup ...).

    Raises:
        ValueError: an unknown architecture, a bias for one that has none, or a bad loss argument.

    Example:
        >>> loss_fn = open_clip_loss("ViT-S-32-alt", temperature=0.07, tile_size=256)  # ClipLoss
    """
    if is_siglip(architecture):
        initial = check_architecture(architecture)["init_logit_bias"] if bias is None else bias
        return SigLipLoss(temperature=temperature, bias=float(initial), learnable=True, **options)
    if bias is not None:
        raise ValueError(f"bias={bias!r}: architecture={architecture!r} is a CLIP architecture (its config sets no "
                         "init_logit_bias), trained without a bias; pass bias=None")
    return ClipLoss(temperature=temperature, learnable=True, **options)


def build_open_clip(
    architecture: str, pretrained: str | os.PathLike | None = None, image_size: int | None = None
) -> OpenClipTowers:
    """Build `architecture` with random weights (or the weights of the local file `pretrained`) and split it
    into an image tower, a text tower and a learnable loss at the model's temperature: a SigLipLoss at its bias
    for a SigLIP architecture, else a ClipLoss (`open_clip_loss`).

    Args:
        architecture: an open_clip model name without a hub tower, e.g. "ViT-B-32"; `open_clip.list_models()`.
        pretrained: a local checkpoint file (.pt, .bin or .safetensors, as open_clip saves them); never a tag
            that open_clip would download.
        image_size: train at this resolution instead of the architecture's (open_clip's `force_image_size`;
            a checkpoint's position embeddings are resized on loading).

    Raises:
        ValueError: an unknown architecture, one whose towers come from the Hugging Face hub, a `pretrained`
            that is not an existing file, or a bad image_size; all before anything is built.

    Example:
        >>> parts = build_open_clip("ViT-S-32-alt")
        >>> cache = GradCache([parts.image_tower, parts.text_tower], parts.loss_fn, chunk_size=64)
        >>> cache.step(images, parts.tokenizer(captions))
    """
    check_architecture(architecture)
    check_int(image_size, "image_size", optional="the architecture's")
    if pretrained is not None and not os.path.isfile(pretrained):
        raise ValueError(
            f"pretrained={str(pretrained)!r} is not a file; give the path of a local open_clip checkpoint "
            "(open_clip's pretrained tags would download weights, which this project never does)."
        )
    model, preprocess_train, preprocess_val = open_clip.create_model_and_transforms(
        architecture, pretrained=None, pretrained_image=False, pretrained_text=False, force_image_size=image_size)
    if pretrained is not None:
        open_clip.load_checkpoint(model, str(pretrained))
    scale = model.logit_scale.detach().exp().item()  # 1 / temperature
    bias = getattr(model, "logit_bias", None)  # set exactly for a SigLIP architecture (its init_logit_bias)
    loss_fn = open_clip_loss(architecture, temperature=1 / scale, bias=None if bias is None else bias.item())
    image_tower = model.visual
    model.visual = None  # the text tower keeps everything but the image tower and the logit scale and bias
    del model.logit_scale
    if "logit_bias" in model._parameters:
        del model.logit_bias
    return OpenClipTowers(image_tower, _TextTower(model), open_clip.get_tokenizer(architecture),
                          preprocess_train, preprocess_val, loss_fn)
