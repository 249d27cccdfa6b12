"""A mode's model and loss as every command builds them: the mode's own, with what the run's options add on
top (gradient checkpointing, the Matryoshka sum). The run, `gradcache eval` and the other commands all build
through here, so a checkpoint always meets the modules it was saved from."""
from __future__ import annotations

from torch import nn

from gradcache.train.config import RunConfig
from gradcache.train.modes.base import Mode


def build_model(mode: Mode, config: RunConfig) -> nn.Module:
    """The mode's freshly initialised model, with gradient checkpointing when asked."""
    model = mode.build_model(config)
    if config.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def build_loss(mode: Mode, config: RunConfig) -> nn.Module:
    """The mode's loss, summed over `--matryoshka-dims` where given (`Mode.matryoshka`)."""
    loss = mode.build_loss(config)
    return loss if config.matryoshka_dims is None else mode.matryoshka(loss, config.matryoshka_dims)
