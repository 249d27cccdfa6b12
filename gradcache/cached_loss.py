"""`CachedLoss`: GradCache as a loss module, for training loops that own the backward call (cache.py says how
phase (3) runs inside `loss.backward()`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gradcache.cache import GradCache
from gradcache.options import Options, Unpack
from gradcache.strategy import Encoders, LossFn


class CachedLoss(nn.Module):
    """GradCache as a loss: `loss = cached(*inputs)` runs phases (1)-(2); `loss.backward()` runs phase (3).

    For training loops that own the backward call (Lightning, the Hugging Face Trainer, a loop with a
    GradScaler): `scaler.scale(loss).backward()` and `(loss / k).backward()` work as for any loss, since the
    incoming gradient multiplies the cached gradients in float32. Gradients equal those of `FullBatch.step`,
    also when a DDP wrapper holds the whole model (see `GradCache.reencode_and_backward`). Called with
    gradients disabled (an evaluation loop), it returns the loss and keeps nothing. Each call keeps its own
    batch for its backward, so two calls before one backward cannot mix batches.

    Args:
        encoders, loss_fn, chunk_size, **options: as for `GradCache`, except `scaler`: the caller scales the
            loss it back-propagates, so a scaler given here could only be ignored, and is refused (TypeError).

    Example:
        >>> cached = CachedLoss([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> loss = cached(images, tokens)
        >>> scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    """

    def __init__(
        self, encoders: Encoders, loss_fn: LossFn, chunk_size: int | Sequence[int] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if options.get("scaler") is not None:
            raise TypeError(
                f"CachedLoss got scaler={options['scaler']!r}, which it cannot honour: the caller owns the "
                "backward, so scale there: scaler.scale(loss).backward(). Drop the scaler argument (or use "
                "GradCache(..., scaler=scaler).step, which runs the backward itself)."
            )
        super().__init__()
        self.cache = GradCache(encoders, loss_fn, chunk_size, **options)
        self.encoders = nn.ModuleList(self.cache.all_encoders())  # so .to(), .parameters() and .train() reach them
        if isinstance(loss_fn, nn.Module):
            self.loss_fn = loss_fn

    def forward(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        return self.cache.loss(*inputs, **loss_kwargs)
