"""The checks and the activation both reranking losses share: one score per (query, candidate) pair.

A cross-encoder (reranker) maps a pair to one score; GradCache caches the scores as embeddings of width 1, so a
reranking loss takes (M,) or (M, 1) scores, in float32 or wider, autocast off, as every loss computes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradcache.non_finite import NonFiniteEmbeddingError

from .precision import compute_dtype

__all__ = ["Activation", "checked_scores", "check_activation"]

Activation = Callable[[torch.Tensor], torch.Tensor]


def check_activation(activation: object) -> Activation | None:
    """Return ``activation`` if it is None or callable (a function or an ``nn.Module``); TypeError otherwise."""
    if activation is not None and not callable(activation):
        raise TypeError(
            f"activation must be None (the raw scores) or a callable such as torch.nn.Sigmoid(), got "
            f"{activation!r} of type {type(activation).__name__}"
        )
    return activation


def checked_scores(scores: object, name: str = "scores") -> torch.Tensor:
    """``scores`` as a (M,) tensor in the loss's compute dtype; TypeError/ValueError naming what is wrong.

    Raises:
        TypeError: not a tensor, or not floating point.
        ValueError: not (M,) or (M, 1), empty, or holding NaN/inf.
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (M,) or (M, 1), got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {scores.dtype}; pass the model's scores (logits)")
    if not (scores.ndim == 1 or (scores.ndim == 2 and scores.shape[1] == 1)):
        raise ValueError(
            f"{name} must be (M,) or (M, 1), one score per (query, candidate) pair, got shape "
            f"{tuple(scores.shape)}; a reranker has one output label (num_labels=1)"
        )
    if scores.shape[0] == 0:
        raise ValueError(f"{name} is empty; the loss needs at least one (query, candidate) pair")
    bad = int((~torch.isfinite(scores.detach())).sum())
    if bad:
        raise NonFiniteEmbeddingError(f"{name} has {bad} NaN/inf entries (shape {tuple(scores.shape)})")
    return scores.reshape(-1).to(compute_dtype(scores))
