"""Learning-rate schedule: linear warm-up from zero, then cosine decay to `final_fraction` of the peak.

factor(s) = (s + 1) / warmup for s < warmup, else final + (1 - final) (1 + cos(pi (s - warmup) / (total - warmup))) / 2
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosine:
    """The multiplicative factor of the peak learning rate at step s (a class so the scheduler can save it)."""

    def __init__(self, warmup_steps: int, total_steps: int, final_fraction: float = 0.0) -> None:
        if total_steps < 1:
            raise ValueError(f"total steps must be >= 1, got {total_steps}")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"--warmup {warmup_steps} must be between 0 and the {total_steps} total steps")
        if not 0 <= final_fraction <= 1:
            raise ValueError(f"final_fraction must be in [0, 1], got {final_fraction}")
        self.warmup_steps, self.total_steps, self.final_fraction = warmup_steps, total_steps, final_fraction

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.final_fraction + (1 - self.final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  final_fraction: float = 0.0) -> LambdaLR:
    """A scheduler to step once after each optimizer step; step 0 already runs at the first warm-up rate."""
    return LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps, final_fraction))
