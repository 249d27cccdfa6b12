"""An encoder with trainable parameters whose output does not require grad (detached from them, or computed
under no_grad) is refused with a ValueError naming the encoder and the cause, by every strategy, before any
`.grad` is written: it would otherwise train nothing, silently. A frozen tower (no parameter requiring grad)
stays allowed."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss
from tests.conftest import mlp


class Detached(nn.Module):
    """An MLP whose output is cut off from its parameters, by .detach() or by torch.no_grad()."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.inner, self.how = mlp(), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "no_grad":
            with torch.no_grad():
                return self.inner(x)
        return self.inner(x).detach()


STEPS = {
    "GradCache": lambda encoders, loss: GradCache(encoders, loss, chunk_size=3).step,
    "GradCache with a memory budget": lambda encoders, loss: GradCache(encoders, loss, chunk_size=3,
                                                                       memory_budget=2**30).step,
    "CachedLoss": lambda encoders, loss: lambda *x: CachedLoss(encoders, loss, chunk_size=3)(*x).backward(),
    "FullBatch": lambda encoders, loss: FullBatch(encoders, loss).step,
    "NaiveAccumulation": lambda encoders, loss: NaiveAccumulation(encoders, loss, chunk_size=3).step,
}


@pytest.mark.parametrize("how", ["detach", "no_grad"])
@pytest.mark.parametrize("strategy", STEPS)
def test_an_output_detached_from_trainable_parameters_is_refused_naming_the_encoder(strategy, how):
    torch.manual_seed(0)
    image, text, loss = mlp(), Detached(how), ClipLoss(temperature=0.1, learnable=True)
    with pytest.raises(ValueError) as caught:
        STEPS[strategy]([image, text], loss)(torch.randn(6, 10), torch.randn(6, 10))
    message = str(caught.value)
    assert "input 1" in message and "Detached" in message and "does not require grad" in message
    assert "requires_grad_(False)" in message  # the fix for a tower meant to be frozen
    assert all(p.grad is None for m in (image, text, loss) for p in m.parameters())


@pytest.mark.parametrize("strategy", STEPS)
def test_a_frozen_tower_is_still_allowed(strategy):
    torch.manual_seed(0)
    image, text, loss = mlp(), Detached("detach").requires_grad_(False), ClipLoss(temperature=0.1, learnable=True)
    STEPS[strategy]([image, text], loss)(torch.randn(6, 10), torch.randn(6, 10))
    assert all(p.grad is not None for p in image.parameters())
