"""`--strategy` and `--precision`: the library's strategies by name, and the autocast dtype of each precision."""
from __future__ import annotations

import torch
from torch import nn

from gradcache import registry
from gradcache.strategy import Strategy
from gradcache.train.config import RunConfig

# --strategy: the library's strategies (gradcache.registry) that fit a training loop which steps the optimizer
# itself; cached_loss is GradCache's other door, for loops that own the backward.
STRATEGIES: dict[str, type[Strategy]] = {name: registry.STRATEGIES[name] for name in ("gradcache", "naive", "full")}
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_strategy(config: RunConfig, encoders: nn.Module | list[nn.Module], loss: nn.Module,
                   scaler: torch.amp.GradScaler, trim_padding: bool,
                   chunk_size: int | tuple[int, ...] | None = None, sparse_cache: bool = False,
                   reuse_outputs: list[nn.Module] | None = None) -> Strategy:
    """`--strategy` over the encoders; `full` takes the whole batch at once and ignores `--chunk-size`;
    `chunk_size` (one per input) replaces `--chunk-size` where the mode gives one; `--memory-budget` and
    `--chunk-tokens` (the row modes' options; None elsewhere) go to the strategy as its options of those names, and
    `sparse_cache` and `reuse_outputs` (the mode's: `Mode.reused_modules`, a frozen vision tower) too."""
    chunk_size = config.chunk_size if chunk_size is None else chunk_size
    return STRATEGIES[config.strategy](
        encoders, loss, None if config.strategy == "full" else chunk_size, trim_padding=trim_padding,
        autocast_dtype=PRECISIONS[config.precision], scaler=scaler, fsdp_reduce=config.fsdp_reduce,
        memory_budget=config.memory_budget, chunk_tokens=config.chunk_tokens, sparse_cache=sparse_cache,
        reuse_outputs=reuse_outputs or None,
    )
