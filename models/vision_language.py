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

    ``always_run_vision`` runs the vision tower (and Idefics3's connector) in every forward: where the inputs hold
    no image it runs on a one-image stand-in (`stand_in_image`) just before the language model, where the real
    images would have run, and adds 0 x its features' sum to the language model's input embeddings. The embedding
    is unchanged (x + 0 = x), but every forward then runs the same modules in the same order and gives every
    parameter a gradient, which several processes need: DeepSpeed ZeRO-3 and FSDP2 gather each module's
    parameters as it runs (a collective every rank must join), and DDP reduces every trained parameter's gradient.

    Args:
        path_or_model: a local folder written by ``save_pretrained`` (``AutoModel``, local files only) or a
            built model.
        pooling: ``"last"`` or ``"mean"``.
        normalize: L2-normalise the pooled output.
        train_vision: leave the vision tower's parameters trainable.
        always_run_vision: run the vision tower in every forward, on a stand-in image where the inputs hold none.

    Raises:
        ValueError: unknown ``pooling``; a model without a vision tower or a language model by the names
            transformers' VLMs use (``VISION_TOWERS``, ``LANGUAGE_MODELS``); a folder that does not load.
        TypeError: ``path_or_model`` is neither a path nor an ``nn.Module``.

    Example:
        >>> encoder = VisionLanguageEncoder("/data/qwen2-vl-2b")  # written by save_pretrained
        >>> cache = GradCache([encoder, encoder], InfoNCE(0.05), chunk_size=8, reuse_outputs=[encoder.vision_tower])
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, pooling: str = "last", normalize: bool = True,
                 train_vision: bool = False, always_run_vision: bool = False) -> None:
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
        self.always_run_vision = always_run_vision
        if always_run_vision:
            stand_in_image(self.model)  # refuses a family it cannot build a stand-in for, before any forward
        self._tower_ran = False
        self.vision_tower.register_forward_hook(self._note_tower_ran)
        self.language_model.register_forward_pre_hook(self._run_stand_in, with_kwargs=True, prepend=True)
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

    def _note_tower_ran(self, module: nn.Module, args: Any, output: Any) -> None:
        self._tower_ran = True

    def _run_stand_in(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
        """Before the language model: where `always_run_vision` and the tower has not run in this forward, run it
        on the stand-in image and add 0 x its features' sum to the input embeddings."""
        embeds = kwargs.get("inputs_embeds")
        if not self.always_run_vision or self._tower_ran or embeds is None:
            return None
        core = _vision_language_core(self.model)
        features = core.get_image_features(**stand_in_image(core, embeds.device), return_dict=True).pooler_output
        if isinstance(features, (list, tuple)):  # per image, as the model's own forward concatenates them
            features = torch.cat(features, dim=0)
        # only what the model's forward reads (the merged features): DeepSpeed runs a module's backward hook once
        # per output that gets a gradient, so reading one more would change the order ZeRO-3 traces
        return args, {**kwargs, "inputs_embeds": embeds + 0.0 * features.to(embeds.dtype).sum()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **vision: Any) -> torch.Tensor:
        self._tower_ran = False
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **vision).last_hidden_state  # (B, L, H)
        if self.pooling == "last":
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token(attention_mask)]  # (B, H)
        else:
            weights = attention_mask.ne(0).to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # (B, H)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def stand_in_image(model: nn.Module, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The smallest image input `model`'s ``get_image_features`` takes (pixel values 1, never all 0: Idefics3 drops
    all-zero images as padding): Qwen2-VL / Qwen2.5-VL: one image of merge x merge patches (its grid (1, merge,
    merge)); Idefics3 / SmolVLM: one image of scale x scale patches, which its connector's pixel shuffle folds into
    one token. A model of the VLM, or any module holding one.

    Raises:
        ValueError: `model` is of another family (its config has neither a spatial merge nor a scale factor).
    """
    core = _vision_language_core(model)
    config = core.config
    vision = config.vision_config
    if hasattr(vision, "spatial_merge_size") and hasattr(vision, "temporal_patch_size"):  # Qwen2-VL, Qwen2.5-VL
        merge = vision.spatial_merge_size
        channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
        width = channels * vision.temporal_patch_size * vision.patch_size ** 2
        return {"pixel_values": torch.ones(merge * merge, width, device=device),
                "image_grid_thw": torch.tensor([[1, merge, merge]], device=device)}
    if hasattr(config, "scale_factor"):  # Idefics3, SmolVLM
        side = config.scale_factor * vision.patch_size
        return {"pixel_values": torch.ones(1, 1, getattr(vision, "num_channels", 3), side, side, device=device)}
    raise ValueError(f"always_run_vision has no stand-in image for {type(core).__name__} (model_type "
                     f"{getattr(config, 'model_type', None)!r}): it builds them for Qwen2-VL, Qwen2.5-VL and "
                     "Idefics3 / SmolVLM; run it on one process, or leave always_run_vision off")


def _vision_language_core(model: nn.Module) -> nn.Module:
    """The module of `model` that holds both the vision tower and the language model (the one whose
    ``get_image_features`` runs the tower and its merger or connector), under any wrapper (peft's)."""
    for module in model.modules():
        if hasattr(module, "get_image_features") and any(
                isinstance(getattr(module, name, None), nn.Module) for name in LANGUAGE_MODELS):
            return module
    raise ValueError(f"{type(model).__name__} holds no vision-language model with get_image_features")


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
