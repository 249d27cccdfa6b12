"""An open_clip architecture as the training program's CLIP model: two towers, open_clip's tokenizer, our images.

`gradcache train clip --model open_clip:ARCH` trains any open_clip architecture whose towers are open_clip's own
(random init; `--pretrained PATH` loads a local checkpoint file on a fresh run). The program's images are
float tensors in [-1, 1] at `--image-size`; the image tower maps them to open_clip's normalisation, and the
architecture is built at that image size. Needs `pip install "gradcache[open-clip]"`.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

OPEN_CLIP_PREFIX = "open_clip:"  # --model open_clip:ARCH


def open_clip_architecture(model: str) -> str | None:
    """`ARCH` of a `--model open_clip:ARCH`, else None."""
    return model[len(OPEN_CLIP_PREFIX):] if model.startswith(OPEN_CLIP_PREFIX) else None


class _RandomInitNotice(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded for model ... Model initialized randomly." (logged on the
    root logger by `open_clip.create_model`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded")


@contextmanager
def weights_loaded_next() -> Iterator[None]:
    """Build a model inside this when trained weights are loaded into it at once (`gradcache export`, `gradcache
    eval`, the export's reference model): open_clip's notice that the model is initialised randomly is untrue
    there and is dropped. A new run's model keeps it: it does start from random weights."""
    notice, root = _RandomInitNotice(), logging.getLogger()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


class _ImageTower(nn.Module):
    """images in [-1, 1] (B, 3, H, W) -> open_clip's (x - mean) / std on [0, 1] -> its visual tower -> (B, D)."""

    def __init__(self, visual: nn.Module) -> None:
        super().__init__()
        self.visual = visual
        config = getattr(visual, "preprocess_cfg", {})
        self.register_buffer("mean", torch.tensor(config.get("mean", (0.48145466, 0.4578275, 0.40821073))).view(3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(config.get("std", (0.26862954, 0.26130258, 0.27577711))).view(3, 1, 1),
                             persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.visual((images * 0.5 + 0.5 - self.mean) / self.std)


class OpenClipTokenizer:
    """captions -> {"input_ids": (B, context_length)}: open_clip's tokenizer, padded to the architecture's
    context length. No attention mask: open_clip's text tower reads the whole context (it pools at the end-of-text
    token under causal attention), so its padding is never trimmed."""

    def __init__(self, architecture: str) -> None:
        import open_clip

        self.tokenize = open_clip.get_tokenizer(architecture)

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokenize(list(texts))}


class OpenClipModel(nn.Module):
    """An open_clip architecture split into `image_tower` and `text_tower` (no shared parameter), with the
    `encode_image` / `encode_text` of the program's CLIP model.

    Args:
        architecture: an open_clip model name without a Hugging Face hub tower, e.g. "ViT-B-32".
        image_size: the side of the images it is trained on (open_clip's `force_image_size`).

    Raises:
        ValueError: an unknown architecture or one whose towers come from the hub (see `build_open_clip`).
    """

    def __init__(self, architecture: str, image_size: int) -> None:
        super().__init__()
        from gradcache.integrations.open_clip import build_open_clip  # the open-clip extra, only when asked

        parts = build_open_clip(architecture, image_size=image_size)
        self.architecture, self.image_size = architecture, image_size
        self.image_tower = _ImageTower(parts.image_tower)
        self.text_tower = parts.text_tower  # the temperature (and SigLIP's bias) are the loss's: see `load_pretrained`

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.image_tower(images)

    def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.text_tower(input_ids)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """open_clip's own activation checkpointing in both towers."""
        self.image_tower.visual.set_grad_checkpointing(enabled)
        self.text_tower.model.set_grad_checkpointing(enabled)

    @torch.no_grad()
    def load_pretrained(self, path: str | os.PathLike) -> nn.Module:
        """Copy the weights of the local open_clip checkpoint `path` into both towers; return its loss (a ClipLoss,
        or for a SigLIP architecture a SigLipLoss) at its learned temperature (and bias), for the run's loss to
        start from. The global random state is left as it was (the architecture is built once more to read the
        file)."""
        from gradcache.integrations.open_clip import build_open_clip

        with torch.random.fork_rng(devices=[]):
            parts = build_open_clip(self.architecture, pretrained=path, image_size=self.image_size)
        self.image_tower.visual.load_state_dict(parts.image_tower.state_dict())
        self.text_tower.load_state_dict(parts.text_tower.state_dict())
        return parts.loss_fn
