"""A vision-language model (VLM) as an embedder: the language model's last hidden state pooled at each row's last
token (decoder embedders: GME, VLM2Vec, jina-embeddings-v4) or over its attended positions, its vision tower
frozen by default and exposed for `reuse_outputs`, and the names LoRA targets in the language model alone."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradcache.models.checkpointing import hugging_face_checkpointing
from gradcache.models.huggingface import _load_local_model, last_token

VLM_POOLINGS = ("last", "mean")
# Where transformers' VLMs keep their parts: Qwen2-VL / Qwen2.5-VL (`visual`, `language_model`), LLaVA and
# Gemma3 (`vision_tower`, `language_model`), Idefics3 / SmolVLM (`vision_model`, `text_model`).
VISION_TOWERS = ("visual", "vision_tower", "vision_model")
LANGUAGE_MODELS = ("language_model", "text_model")


def _part(model: nn.Module, names: tuple[str, ...], what: str) -> nn.Module:
    for name in names:
        part = getattr(model, name, None)
        if isinstance(part, nn.Module):
            return part
    raise ValueError(f"{type(model).__name__} has no {what} under any of the names {names}; give a vision-language "
                     "model of the Qwen2-VL, Qwen2.5-VL, LLaVA, Gemma3 or Idefics3 / SmolVLM families")


class VisionLanguageEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L), pixel keys ...) -> pooled last hidden state (B, out_dim).

    The inputs are a VLM processor's batch (see `VisionLanguageCollator`), passed to the model whole; the
    embedding is the language model's last hidden state at each row's last attended token (``"last"``, whichever
    side the padding is on; left padding is the decoder's habit) or its mean over the attended positions, image
    tokens included (``"mean"``); ``normalize`` then divides by the L2 norm.

    The vision tower (``vision_tower``) is frozen unless ``train_vision``: pass it to GradCache as
    ``reuse_outputs=[encoder.vision_tower]`` so it runs in phase (1) only. A ``...ForConditionalGeneration``
    model is read through its base model (no language-model head: an embedder never reads logits).

    Args:
        path_or_model: a local folder written by ``save_pretrained`` (``AutoModel``, local files only) or a
            built model.
        pooling: ``"last"`` or ``"mean"``.
        normalize: L2-normalise the pooled output.
        train_vision: leave the vision tower's parameters trainable.

    Raises:
        ValueError: unknown ``pooling``; a model without a vision tower or a language model by the names
            transformers' VLMs use (``VISION_TOWERS``, ``LANGUAGE_MODELS``); a folder that does not load.
        TypeError: ``path_or_model`` is neither a path nor an ``nn.Module``.

    Example:
        >>> encoder = VisionLanguageEncoder("/data/qwen2-vl-2b")  # written by save_pretrained
        >>> cache = GradCache([encoder, encoder], InfoNCE(0.05), chunk_size=8, reuse_outputs=[encoder.vision_tower])
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, pooling: str = "last", normalize: bool = True,
                 train_vision: bool = False) -> None:
        super().__init__()
        if pooling not in VLM_POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not supported; choose one of {VLM_POOLINGS}")
        if isinstance(path_or_model, (str, os.PathLike)):
            model = _load_local_model(path_or_model)
        elif isinstance(path_or_model, nn.Module):
            model = path_or_model
        else:
            raise TypeError(f"path_or_model must be a local directory or an nn.Module, got "
                            f"{type(path_or_model).__name__}")
        self.model = getattr(model, "base_model", model)  # a ...ForConditionalGeneration's model, without its head
        _part(self.model, LANGUAGE_MODELS, "language model")
        self.vision_tower.requires_grad_(train_vision)
        self.pooling = pooling
        self.normalize = normalize
        config = getattr(self.model, "config", None)
        self.out_dim = getattr(getattr(config, "text_config", config), "hidden_size", None)
        self.train()

    @property
    def vision_tower(self) -> nn.Module:
        """The vision encoder (patches -> features), the module `reuse_outputs` runs once when it is frozen."""
        return _part(self.model, VISION_TOWERS, "vision tower")

    @property
    def language_model(self) -> nn.Module:
        return _part(self.model, LANGUAGE_MODELS, "language model")

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Use the model's own activation checkpointing (non-reentrant); active in training mode only."""
        hugging_face_checkpointing(self.model, enabled)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **vision: Any) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **vision).last_hidden_state  # (B, L, H)
        if self.pooling == "last":
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token(attention_mask)]  # (B, H)
        else:
            weights = attention_mask.ne(0).to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # (B, H)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def language_model_lora_targets(encoder: nn.Module, leaves: tuple[str, ...] | None = None) -> list[str]:
    """The names (relative to `encoder`) of the linear layers of its VLM's language model, for peft's
    ``LoraConfig(target_modules=...)``: never one of the vision tower's (nor its merger / connector), whose
    layers share leaf names (``qkv``, ``fc1``, ``q_proj``) that a suffix match would catch.

    Args:
        encoder: a `VisionLanguageEncoder` or any module holding a VLM.
        leaves: the layers' own names to keep (``("q_proj", "v_proj")``); None: every linear layer of the
            language model.

    Raises:
        ValueError: `encoder` holds no language model by the names transformers' VLMs use, or no linear layer
            of it matches `leaves`.
    """
    language = next((module for module in encoder.modules() if any(
        isinstance(getattr(module, name, None), nn.Module) for name in LANGUAGE_MODELS)), None)
    if language is None:
        raise ValueError(f"{type(encoder).__name__} holds no language model under any of the names {LANGUAGE_MODELS}")
    language = _part(language, LANGUAGE_MODELS, "language model")
    inside = {id(module) for module in language.modules()}
    names = [name for name, module in encoder.named_modules()
             if isinstance(module, nn.Linear) and id(module) in inside
             and (leaves is None or name.rsplit(".", 1)[-1] in leaves)]
    if not names:
        raise ValueError(f"no linear layer of the language model is named one of leaves={leaves!r}; leave leaves "
                         "None for all of them, or name some such as ('q_proj', 'v_proj')")
    return names
