"""BatchNorm running statistics advance once per chunk, in the first pass, and never again on recomputation.

GradCache's second pass, and activation checkpointing in every strategy, run a module's forward a second
time. In train mode each extra forward would move `running_mean`, `running_var` and `num_batches_tracked`
again. `running_stats_frozen` is the one way this project stops that, for the strategies and for
gradcache.models' activation checkpointing alike: inside it each such layer runs with momentum 0, so its update
`(1 - 0) * running + 0 * batch` rewrites the running buffers with their own values, and the buffers are put
back as they entered on the way out. The buffers are never switched off or swapped during the block:
BatchNorm's backward saves them, and `torch.utils.checkpoint` checks that a recomputation saves the same tensors.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

_warned = False


def _tracking_batchnorms(modules: Iterable[nn.Module]) -> list[_BatchNorm]:
    seen: dict[int, _BatchNorm] = {}
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, _BatchNorm) and sub.training and sub.track_running_stats:
                seen.setdefault(id(sub), sub)
    return list(seen.values())


@contextlib.contextmanager
def running_stats_frozen(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Whatever forwards run inside, the BatchNorm layers of `modules` normalise as usual and their buffers
    leave as they entered."""
    norms = _tracking_batchnorms(modules)
    saved = [(norm.momentum, [buffer.clone() for buffer in _buffers(norm)]) for norm in norms]
    for norm in norms:
        norm.momentum = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            for norm, (momentum, buffers) in zip(norms, saved):
                norm.momentum = momentum
                for live, kept in zip(_buffers(norm), buffers):
                    live.copy_(kept)


def _buffers(norm: _BatchNorm) -> list[torch.Tensor]:
    return [b for b in (norm.running_mean, norm.running_var, norm.num_batches_tracked) if b is not None]


def warn_if_batchnorm_in_chunks(modules: Iterable[nn.Module]) -> None:
    """Warn once per process that train-mode BatchNorm normalises each chunk with that chunk's statistics."""
    global _warned
    if _warned or not _tracking_batchnorms(modules):
        return
    _warned = True
    warnings.warn(
        "An encoder has BatchNorm layers in train mode: their batch statistics are computed per chunk, so the "
        "gradient is that of a chunked forward, not of one full-batch forward. For an exact large-batch "
        "gradient use GroupNorm or LayerNorm (e.g. models.ResNetEncoder(norm='group')), or a larger chunk_size. "
        "Running statistics are still advanced once per chunk, as by one chunked forward.",
        UserWarning,
        stacklevel=3,
    )
