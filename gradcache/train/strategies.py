"""`--strategy` and `--precision`: the library's strategies by name, and the autocast dtype of each precision."""
from __future__ import annotations

import torch
from torch import nn

import gradcache
from gradcache.strategy import Strategy
from gradcache.train.config import RunConfig

STRATEGIES: dict[str, type[Strategy]] = {
    "gradcache": gradcache.GradCache,
    "naive": gradcache.NaiveAccumulation,
    "full": gradcache.FullBatch,
}
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_strategy(config: RunConfig, encoders: nn.Module | list[nn.Module], loss: nn.Module,
                   scaler: torch.amp.GradScaler, trim_padding: bool) -> Strategy:
    """`--strategy` over the encoders; `full` takes the whole batch at once and ignores `--chunk-size`."""
    return STRATEGIES[config.strategy](
        encoders, loss, None if config.strategy == "full" else config.chunk_size, trim_padding=trim_padding,
        autocast_dtype=PRECISIONS[config.precision], scaler=scaler, fsdp_reduce=config.fsdp_reduce,
    )
