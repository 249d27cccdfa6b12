"""A built-in encoder saved as a folder (``model.safetensors`` + ``config.json``) and rebuilt from it.

``gradcache train simclr|clip`` (with a preset of ``IMAGE_ENCODER_PRESETS``) ends by writing its model this way
(``RUN/model/``, see gradcache/train/export/builtin.py); ``from_pretrained(folder)`` rebuilds the same module,
weights loaded strictly, in eval mode. ``config.json`` holds ``PretrainedConfig`` (how to build the module) and,
for people, how inputs are prepared: images RGB at ``image_size``, float in [-1, 1] (``pixel / 127.5 - 1``),
captions through ``ByteTokenizer(context_length)``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache.models.clip import CLIP
from gradcache.models.factory import build_image_encoder
from gradcache.models.heads import ProjectionHead
from gradcache.models.safetensors_header import check_shapes
from gradcache.models.simclr import SimCLRModel
from gradcache.models.text import TextEncoder
from gradcache.models.tokenizer import ByteTokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE_KEY = "gradcache_architecture"  # the key that tells this config.json from a Hugging Face one
ARCHITECTURES = ("simclr", "clip")
IMAGE_INPUT = "RGB float (B, 3, image_size, image_size) in [-1, 1]: pixel / 127.5 - 1 (mean 0.5, std 0.5)"


@dataclass(frozen=True)
class PretrainedConfig:
    """What rebuilds a built-in encoder: ``config.json`` of an exported folder.

    Args:
        gradcache_architecture: ``"simclr"`` (backbone + projection head) or ``"clip"`` (image and text towers).
        image_encoder: a preset of ``IMAGE_ENCODER_PRESETS`` (``"convnet"``, ``"resnet18"`` ...).
        image_encoder_options: the preset fields it was built with (``build_image_encoder(name, **options)``).
        image_size: the side of the square images it was trained on.
        embed_dim: the size of the projected embedding (SimCLR's head output, CLIP's joint space).
        hidden_dim: SimCLR's projection-head hidden width (None for CLIP).
        text_encoder: CLIP's ``TextEncoder`` keyword arguments (``vocab_size``, ``context_length``, ``width``,
            ``layers``, ``heads``); None for SimCLR.
        temperature: the loss's temperature as trained (CLIP's learned one), for scoring as it was trained.
        preprocessing: how to prepare inputs, for people (never read back).
    """

    gradcache_architecture: str
    image_encoder: str
    image_encoder_options: dict[str, Any]
    image_size: int
    embed_dim: int
    hidden_dim: int | None = None
    text_encoder: dict[str, int] | None = None
    temperature: float | None = None
    preprocessing: dict[str, Any] = field(default_factory=dict)
    format_version: int = 1

    def __post_init__(self) -> None:
        if self.gradcache_architecture not in ARCHITECTURES:
            raise ValueError(f"gradcache_architecture={self.gradcache_architecture!r} is not one of {ARCHITECTURES}")
        if self.gradcache_architecture == "clip" and self.text_encoder is None:
            raise ValueError("a clip config needs text_encoder (TextEncoder's vocab_size, context_length, width, "
                             "layers, heads)")
        if self.gradcache_architecture == "simclr" and self.hidden_dim is None:
            raise ValueError("a simclr config needs hidden_dim (the projection head's hidden width)")

    def build(self) -> nn.Module:
        """A randomly initialised module of this architecture (``SimCLRModel`` or ``CLIP``)."""
        backbone = build_image_encoder(self.image_encoder, **self.image_encoder_options)
        if self.gradcache_architecture == "simclr":
            return SimCLRModel(backbone, ProjectionHead(backbone.out_dim, hidden_dim=self.hidden_dim,
                                                        out_dim=self.embed_dim))
        return CLIP(backbone, TextEncoder(**self.text_encoder), embed_dim=self.embed_dim)

    def tokenizer(self) -> ByteTokenizer:
        """CLIP's caption tokenizer as trained.

        Raises:
            ValueError: a SimCLR config (it has no text tower).
        """
        if self.text_encoder is None:
            raise ValueError(f"a {self.gradcache_architecture} model has no text tower, so no tokenizer")
        return ByteTokenizer(self.text_encoder["context_length"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PretrainedConfig:
        """Raises ValueError on a dict that is not such a config (it names the missing or unknown keys)."""
        names = {f.name for f in fields(cls)}
        missing = sorted(name for name in ("gradcache_architecture", "image_encoder", "image_encoder_options",
                                           "image_size", "embed_dim") if name not in values)
        if missing:
            raise ValueError(f"the config lacks {missing}; it was not written by gradcache's export")
        if values.get("format_version", 1) > 1:
            raise ValueError(f"format_version {values['format_version']} is newer than this gradcache reads (1); "
                             "upgrade gradcache")
        return cls(**{key: value for key, value in values.items() if key in names})


def read_pretrained_config(folder: str | os.PathLike) -> PretrainedConfig:
    """The ``PretrainedConfig`` in ``folder/config.json``.

    Raises:
        FileNotFoundError: no ``config.json`` there.
        ValueError: it is not a gradcache config (a Hugging Face ``config.json``, say) or is unreadable.
    """
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_FILE}; give a folder written by gradcache export "
                                "(RUN/model of a simclr or clip run)")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(values, dict) or ARCHITECTURE_KEY not in values:
        raise ValueError(f"{path} has no {ARCHITECTURE_KEY!r}: it is not a gradcache built-in encoder (a Hugging Face "
                         "folder loads with transformers, a sentence-transformers one with SentenceTransformer)")
    return PretrainedConfig.from_dict(values)


def from_pretrained(folder: str | os.PathLike) -> nn.Module:
    """The built-in encoder saved in ``folder`` (``config.json`` + ``model.safetensors``), in eval mode.

    SimCLR: ``SimCLRModel`` (``model.embed(images)`` the backbone features, ``model(images)`` the projection);
    CLIP: ``CLIP`` (``encode_image(images)``, ``encode_text(**read_pretrained_config(folder).tokenizer()(texts))``).
    Images are RGB floats in [-1, 1] at the config's ``image_size``. Embeddings are unnormalised, as trained
    (the losses normalise).

    Raises:
        FileNotFoundError: ``folder`` lacks ``config.json`` or ``model.safetensors``.
        ValueError: the config is not a gradcache one, or the weights do not fit it (checked against the
            weights' header before the model is built), or the weights file is corrupt; it names the file.

    Example:
        >>> model = gradcache.models.from_pretrained("runs/simclr-20261130-170000/model")
        >>> features = model.embed(images * 2 - 1)  # images in [0, 1], (B, 3, 32, 32) -> (B, 256)
    """
    from safetensors.torch import load_file

    config = read_pretrained_config(folder)
    weights = Path(folder) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has {CONFIG_FILE} but no {WEIGHTS_FILE}; export the run again")
    try:  # the config against the weights' header before anything of the config's size is allocated
        with torch.device("meta"):
            check_shapes(config.build(), weights)
    except TypeError as error:
        raise ValueError(f"{Path(folder) / CONFIG_FILE} does not build a model: {error}") from error
    model = config.build()
    try:
        model.load_state_dict(load_file(weights))
    except RuntimeError as error:
        raise ValueError(f"{weights} does not fit the model its {CONFIG_FILE} describes: {error}") from error
    return model.eval()
