"""Which wrappers a trainer may put around the model GradCache runs in, checked before the first forward.

GradCache runs its second pass inside the trainer's backward, so a wrapper that decides at forward time what
the backward will do must leave room for it:

- DDP around the whole model (Lightning, the Hugging Face Trainer): exact, one all-reduce per step, with DDP's
  default `find_unused_parameters=False`. With `find_unused_parameters=True` DDP walks the loss's graph at
  forward time, finds none of the encoders' parameters there (the second pass has not run yet), marks them
  ready at once and fails with "marked as ready twice" when their gradients arrive: refused here.
- DDP around the encoder itself (sentence-transformers' trainer): every chunk runs its own DDP forward, so any
  `find_unused_parameters` works.
- `nn.DataParallel` replicates the module per forward, FSDP1 (`FullyShardedDataParallel`) reshards the
  parameters after the forward the second pass needs, and DeepSpeed's engine owns the backward: refused here.
  Shard with FSDP2's `fully_shard` on the encoders instead, which GradCache handles.
"""
from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

_UNSUPPORTED = ("DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine")


def check_wrapper(wrapper: nn.Module, *, above_the_loss: bool, where: str) -> None:
    """Raise unless GradCache runs exactly inside `wrapper`, the module the trainer calls.

    Args:
        wrapper: what the trainer calls (the model itself, or its wrapper).
        above_the_loss: True when the wrapper's forward runs the whole loss (a DDP wrapper of a module holding a
            CachedLoss); False when it wraps one encoder that GradCache calls chunk by chunk.
        where: the integration, for the message.

    Raises:
        ValueError: a DDP wrapper above the loss with `find_unused_parameters=True`.
        TypeError: `nn.DataParallel`, FSDP1 or a DeepSpeed engine.
    """
    names = {cls.__name__ for cls in type(wrapper).__mro__}
    for name in _UNSUPPORTED:
        if name in names:
            raise TypeError(
                f"{where} cannot run GradCache inside {type(wrapper).__name__}: its second pass runs in the "
                "backward, which this wrapper does not leave to it. Use one process or DDP (torchrun), and to "
                "shard, apply torch.distributed.fsdp.fully_shard to the encoders before building the loss."
            )
    if above_the_loss and isinstance(wrapper, DistributedDataParallel) and wrapper.find_unused_parameters:
        raise ValueError(
            f"{where}: DDP with find_unused_parameters=True around the loss fails ('marked as ready twice'), since "
            "at forward time the encoders' parameters are not yet in the loss's graph; use "
            "find_unused_parameters=False (DDP's default; Hugging Face: ddp_find_unused_parameters=False; "
            "Lightning: strategy='ddp')."
        )
