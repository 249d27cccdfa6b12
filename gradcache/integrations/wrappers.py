"""Which wrappers a trainer may put around the model GradCache runs in, checked before the first forward.

GradCache runs its second pass inside the trainer's backward, so a wrapper that decides at forward time what
the backward will do must leave room for it:

- DDP around the whole model (Lightning, the Hugging Face Trainer): exact, one all-reduce per step, with DDP's
  default `find_unused_parameters=False`. With `find_unused_parameters=True` DDP walks the loss's graph at
  forward time, finds none of the encoders' parameters there (the second pass has not run yet), marks them
  ready at once and fails with "marked as ready twice" when their gradients arrive: refused here.
- DDP around the encoder itself (sentence-transformers' trainer): every chunk runs its own DDP forward, so any
  `find_unused_parameters` works.
- A DeepSpeed engine around the whole model owns the backward (`engine.backward(loss)`, then its reduction):
  exact, one reduction per step, only where the trainer runs that backward inside
  `gradcache.deepspeed_engine.reduced_once_above_the_loss` (`GradCacheTrainer` does), its config checked by
  `check_deepspeed_engine`; refused elsewhere.
- `nn.DataParallel` replicates the module per forward and FSDP1 (`FullyShardedDataParallel`) reshards the
  parameters after the forward the second pass needs: refused here. Shard with FSDP2's `fully_shard` on the
  encoders instead, which GradCache handles.
"""
from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradcache.deepspeed_engine import check_deepspeed_engine, is_deepspeed_engine

_UNSUPPORTED = ("DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine")


def check_wrapper(wrapper: nn.Module, *, above_the_loss: bool, where: str, deepspeed_coalesced: bool = False) -> None:
    """Raise unless GradCache runs exactly inside `wrapper`, the module the trainer calls.

    Args:
        wrapper: what the trainer calls (the model itself, or its wrapper).
        above_the_loss: True when the wrapper's forward runs the whole loss (a DDP wrapper of a module holding a
            CachedLoss); False when it wraps one encoder that GradCache calls chunk by chunk.
        where: the integration, for the message.
        deepspeed_coalesced: True when the caller runs a DeepSpeed engine's backward inside
            `reduced_once_above_the_loss` (a DeepSpeed engine above the loss is then checked, not refused).

    Raises:
        ValueError: a DDP wrapper above the loss with `find_unused_parameters=True`; a DeepSpeed engine whose
            config cannot be exact (`check_deepspeed_engine`, naming the key).
        TypeError: `nn.DataParallel`, FSDP1, or a DeepSpeed engine the caller does not coalesce.
    """
    if deepspeed_coalesced and above_the_loss and is_deepspeed_engine(wrapper):
        try:
            check_deepspeed_engine(wrapper)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        return
    names = {cls.__name__ for cls in type(wrapper).__mro__}
    for name in _UNSUPPORTED:
        if name in names:
            raise TypeError(
                f"{where} cannot run GradCache inside {type(wrapper).__name__}: its second pass runs in the "
                "backward, which this wrapper does not leave to it. Use one process or DDP (torchrun), and to "
                "shard, apply torch.distributed.fsdp.fully_shard to the encoders before building the loss"
                + (" (DeepSpeed runs GradCache as the encoder in your own loop, or around the whole loss in "
                   "gradcache.integrations.huggingface.GradCacheTrainer)." if name == "DeepSpeedEngine" else ".")
            )
    if above_the_loss and isinstance(wrapper, DistributedDataParallel) and wrapper.find_unused_parameters:
        raise ValueError(
            f"{where}: DDP with find_unused_parameters=True around the loss fails ('marked as ready twice'), since "
            "at forward time the encoders' parameters are not yet in the loss's graph; use "
            "find_unused_parameters=False (DDP's default; Hugging Face: ddp_find_unused_parameters=False; "
            "Lightning: strategy='ddp')."
        )
