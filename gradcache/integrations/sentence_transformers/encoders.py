"""A SentenceTransformer as a GradCache encoder (trained, or a frozen guide), and the check that no loss modifier
has patched its forward for the first pass only."""
from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def sentence_embedding(output: Mapping[str, Any]) -> torch.Tensor:
    """The (B, D) embedding a SentenceTransformer returns under "sentence_embedding"."""
    return output["sentence_embedding"]


class SentenceEncoder(nn.Module):
    """A SentenceTransformer, or the trainer's wrapper of it, as a GradCache encoder: GradCache passes a chunk
    of a mapping input as keyword arguments, a SentenceTransformer takes the features as one dict (which may
    hold non-tensor entries such as "modality"). A DDP wrapper's `no_sync` is exposed so phase (3)
    synchronises once per step. `on_forward` is called after every chunk (the progress bar)."""

    def __init__(self, model: nn.Module, on_forward: Callable[[], None]) -> None:
        super().__init__()
        self.model = model
        self.on_forward = on_forward
        if callable(getattr(model, "no_sync", None)):
            self.no_sync = model.no_sync

    def forward(self, **features: Any) -> Any:
        output = self.model(dict(features))
        self.on_forward()
        return output


class GuideEncoder(nn.Module):
    """A guide SentenceTransformer that GradCache sees as a frozen tower: it exposes no parameters, so phase (1)
    encodes each chunk once, without a graph, and phase (3) never re-encodes it; it runs under `no_grad` too."""

    def __init__(self, guide: nn.Module, on_forward: Callable[[], None]) -> None:
        super().__init__()
        self._guide = (guide,)  # a tuple, not a child: its parameters must not reach GradCache or the optimizer
        self.on_forward = on_forward

    def forward(self, **features: Any) -> Any:
        with torch.no_grad():
            output = self._guide[0](dict(features))
        self.on_forward()
        return output


_PLAIN = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def refuse_patched_forward(model: nn.Module, where: str) -> None:
    """Raise a TypeError if a module of `model` has its `forward` replaced by a callable object (a decorator
    class), as sentence-transformers' AdaptiveLayerLoss does while its inner loss runs.

    Such a patch lives for the first pass only: GradCache re-encodes every chunk in the backward pass, after the
    modifier has restored the forward, so the re-encoded chunks would not be the ones the loss saw. Functions and
    methods assigned to `forward` (accelerate's fp32 output conversion) are left alone.
    """
    for name, module in model.named_modules():
        patch = vars(module).get("forward")
        if patch is None or isinstance(patch, _PLAIN):
            continue
        where_in = f"model.{name}" if name else "model"
        kind = f"{type(patch).__module__}.{type(patch).__qualname__}"
        raise TypeError(
            f"{where} found {where_in}.forward replaced by {kind}: a loss modifier (sentence-transformers' "
            "AdaptiveLayerLoss) patches the model's forward while its inner loss runs, and GradCache re-encodes "
            "every chunk in the backward pass, after the patch is removed, so its gradients would belong to "
            f"another forward. Wrap an uncached loss instead (AdaptiveLayerLoss(model, "
            f"MultipleNegativesRankingLoss(model))); MatryoshkaLoss does work around {where}, through its "
            "calculate_loss."
        )


def refuse_static_embedding(model: nn.Module, where: str, role: str, fix: str) -> None:
    """ValueError when `model` embeds with a StaticEmbedding, as sentence-transformers' cached losses refuse it:
    its features are one flat stream of token ids with each text's offset (an EmbeddingBag), with no batch
    dimension to cut into chunks, and its tokenizer (a `tokenizers.Tokenizer`) cannot decode for a guide."""
    static = _static_embedding_class()
    found = [name for name, module in model.named_modules() if static is not None and isinstance(module, static)]
    if found:
        place = f"{role}.{found[0]}" if found[0] else role
        raise ValueError(
            f"{where} got a {role} based on a StaticEmbedding ({place}): its features are one flat stream of token "
            "ids with each text's offset, with no batch dimension to cut into chunks, so it cannot be cached (as "
            f"sentence-transformers' cached losses refuse it too); {fix}."
        )


def _static_embedding_class() -> type | None:
    """sentence-transformers' StaticEmbedding where this version has one (6 moved it; 3.1 added it)."""
    for place in ("sentence_transformers.sentence_transformer.modules", "sentence_transformers.models"):
        try:
            return importlib.import_module(place).StaticEmbedding
        except (ImportError, AttributeError):  # a version without it there
            continue
    return None
