"""One table of every loss configuration, for the tests that hold for all of them (tiled, memory, precision)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss


@dataclass(frozen=True)
class LossCase:
    name: str
    make: Callable[..., nn.Module]  # make(tile_size, temperature=None, column_tile_size=None) -> loss module
    hard_negatives: int | None = None  # InfoNCE only: h hard negatives per query as a third input

    def inputs(self, n: int, d: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> list[torch.Tensor]:
        """Correlated pairs (so the targets matter) of unnormalised rows, plus N * h negatives if any."""
        generator = torch.Generator().manual_seed(seed)
        first = torch.randn(n, d, generator=generator, dtype=torch.float64)
        second = first + 0.7 * torch.randn(n, d, generator=generator, dtype=torch.float64)
        tensors = [first, 2.0 * second]
        if self.hard_negatives is not None:
            tensors.append(torch.randn(n * self.hard_negatives, d, generator=generator, dtype=torch.float64))
        return [t.to(dtype) for t in tensors]


def _with_temperature(factory, default: float):
    def make(tile_size, temperature: float | None = None, column_tile_size: int | None = None):
        return factory(temperature=default if temperature is None else temperature, tile_size=tile_size,
                       column_tile_size=column_tile_size)

    return make


CASES = [
    LossCase("infonce", _with_temperature(InfoNCE, 0.05)),
    LossCase("infonce_hard_negatives", _with_temperature(InfoNCE, 0.05), hard_negatives=2),
    LossCase("infonce_symmetric", _with_temperature(lambda **kw: InfoNCE(symmetric=True, **kw), 0.05)),
    LossCase(
        "infonce_symmetric_hard_negatives",
        _with_temperature(lambda **kw: InfoNCE(symmetric=True, **kw), 0.05),
        hard_negatives=1,
    ),
    LossCase("ntxent", _with_temperature(NTXent, 0.5)),
    LossCase("clip", _with_temperature(ClipLoss, 0.07)),
    LossCase("siglip", _with_temperature(SigLipLoss, 0.1)),
]
CASE_IDS = [case.name for case in CASES]


def loss_and_grads(
    loss_fn: nn.Module, inputs: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The loss, the gradient of each input, and the gradient of each loss parameter (in parameters() order)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    parameters = list(loss_fn.parameters())
    loss = loss_fn(*leaves)
    grads = torch.autograd.grad(loss, leaves + parameters)
    return loss.detach(), list(grads[: len(leaves)]), list(grads[len(leaves):])
