"""What a checkpoint keeps of the model: its state_dict without its frozen parameters.

A frozen parameter is built again, identically, from the run's options by every command that loads a checkpoint
(the run on resume, `gradcache eval`, `export`, `encode`): LoRA's base weights (`--lora-rank`) are read from
`--model`. So a LoRA checkpoint holds the adapter (and, beside it, the optimizer state of the adapter alone), a few
MiB instead of the whole model; a model without frozen parameters is kept whole. Buffers are kept: they are few,
and a model's own (BatchNorm statistics) change in training.
"""
from __future__ import annotations

import torch
from torch import nn


def frozen_names(model: nn.Module) -> set[str]:
    """The state_dict keys of `model`'s parameters that do not require grad."""
    return {name for name, param in model.named_parameters() if not param.requires_grad}


def saved_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` without the frozen parameters."""
    frozen = frozen_names(model)
    return {key: value for key, value in model.state_dict().items() if key not in frozen}


def load_saved_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put `state` (of `saved_state`, checked to hold exactly its keys) into `model`; the frozen parameters stay
    as the model was built with them."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    frozen = frozen_names(model)
    left = [key for key in missing if key not in frozen]
    if left or unexpected:  # the caller checked the keys: a bug here, not a user's file
        raise RuntimeError(f"the saved model state does not fit: lacks {left[:5]}, has unknown {unexpected[:5]}")
