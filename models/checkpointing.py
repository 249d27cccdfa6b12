"""Activation checkpointing of one block, with BatchNorm statistics advanced only by the first pass.

``torch.utils.checkpoint`` re-runs a block's forward during backward. A BatchNorm layer in training
mode would advance its running statistics a second time on that recomputation; the project rule is
that only the first pass advances them. During recomputation each such layer runs with momentum 0,
so its update ``(1 - 0) * running + 0 * batch`` rewrites the running buffers with their own values,
and ``num_batches_tracked`` is put back afterwards. The buffers cannot simply be switched off or
restored with ``copy_``: BatchNorm's backward saves them, and checkpoint checks that the recomputation
saves the same tensors, unmodified.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@contextmanager
def running_statistics_frozen(module: nn.Module) -> Iterator[None]:
    """Within the block, training-mode BatchNorm layers normalise as usual but leave their statistics as they were."""
    norms = [
        layer
        for layer in module.modules()
        if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.training and layer.track_running_stats
    ]
    saved = [(layer.momentum, layer.num_batches_tracked.clone()) for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            for layer, (momentum, batches) in zip(norms, saved):
                layer.momentum = momentum
                layer.num_batches_tracked.copy_(batches)


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
        context_fn=lambda: (nullcontext(), running_statistics_frozen(block)),
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
