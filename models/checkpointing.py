"""Activation checkpointing of one block, with BatchNorm statistics advanced only by the first pass: the
recomputation in backward runs inside `gradcache.batchnorm.running_stats_frozen` (why it works so: there)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradcache.batchnorm import running_stats_frozen


def run_block(block: nn.Module, *args: Any, checkpointed: bool, **kwargs: Any) -> Any:
    """``block(*args, **kwargs)``, recomputed in backward instead of stored when ``checkpointed``.

    Checkpointing only applies when a graph is being built: under ``torch.no_grad`` (GradCache's
    first, graph-free pass) there is nothing to save, so the block simply runs.
    """
    if not (checkpointed and torch.is_grad_enabled()):
        return block(*args, **kwargs)
    return checkpoint(
        block,
        *args,
        use_reentrant=False,
        context_fn=lambda: (nullcontext(), running_stats_frozen([block])),
        **kwargs,
    )


def forward_grad_checkpointing(module: nn.Module, enabled: bool, name: str, required: bool) -> None:
    """Call ``module.set_grad_checkpointing(enabled)`` for a wrapper that owns ``module`` as ``name``.

    A part that holds the deep blocks (``required``) must support it, or enabling fails loudly rather
    than silently saving nothing; a shallow part (a projection head) without the method is skipped.
    """
    setter = getattr(module, "set_grad_checkpointing", None)
    if callable(setter):
        setter(enabled)
    elif required and enabled:
        raise TypeError(
            f"{name} ({type(module).__name__}) has no set_grad_checkpointing(enabled) method; "
            f"use an encoder from gradcache.models or add one that wraps its blocks in run_block."
        )


def hugging_face_checkpointing(model: nn.Module, enabled: bool) -> None:
    """A Hugging Face model's own activation checkpointing (non-reentrant) on or off; active in training mode only.

    Raises:
        TypeError: turning it on for a model that does not support it.
    """
    # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (old names deprecated).
    new_api = hasattr(model, "activation_checkpointing_enable")
    if not enabled:
        name = "activation_checkpointing_disable" if new_api else "gradient_checkpointing_disable"
        if hasattr(model, name):
            getattr(model, name)()
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise TypeError(f"{type(model).__name__} does not support activation checkpointing.")
    options = {"use_reentrant": False}
    if new_api:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
