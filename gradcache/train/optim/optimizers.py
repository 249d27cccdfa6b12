"""Optimisers for contrastive training: AdamW and SGD from torch, LARS and LAMB for large batches, lr scaling.

No maintained package offers LARS and LAMB for current torch (`torch-optimizer` has LAMB but has not had a
release since 2021; `pytorch-lamb` since 2019), so both are written here, compactly, from the papers:

- LARS (You et al. 2017, arXiv 1708.03888), as SimCLR uses it: u = g + wd p;
  u <- eta ||p|| / ||u|| * u; v <- m v + u; p <- p - lr v.
- LAMB (You et al. 2019, arXiv 1904.00962): Adam moments with bias correction, r = m^ / (sqrt(v^) + eps) + wd p;
  p <- p - lr ||p|| / ||r|| * r.

Biases and normalisation parameters (every parameter with fewer than two dimensions) get no weight decay and
no layer-wise adaptation, as in SimCLR and BYOL; a trust ratio is 1 where either norm is zero.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "sgd", "lars", "lamb", "adamw8bit")
LR_SCALINGS = ("linear", "sqrt", "none")


def scaled_learning_rate(lr: float, batch_size: int, base_batch_size: int, scaling: str) -> float:
    """lr x (batch / base) for `linear`, lr x sqrt(batch / base) for `sqrt`, lr for `none`."""
    if scaling not in LR_SCALINGS:
        raise ValueError(f"--lr-scaling {scaling!r} is not one of {', '.join(LR_SCALINGS)}")
    ratio = batch_size / base_batch_size
    return lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling]


def _trust_ratio(param: torch.Tensor, update: torch.Tensor, coefficient: float) -> torch.Tensor:
    param_norm, update_norm = param.norm(), update.norm()
    ratio = coefficient * param_norm / update_norm
    return torch.where((param_norm > 0) & (update_norm > 0), ratio, torch.ones_like(ratio))


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling on SGD with momentum; groups with `adapt=False` are plain SGD."""

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9, weight_decay: float = 1e-6,
                 trust_coefficient: float = 0.001) -> None:
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError(f"LARS needs lr > 0, 0 <= momentum < 1, weight_decay >= 0, trust_coefficient > 0; "
                             f"got {lr}, {momentum}, {weight_decay}, {trust_coefficient}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, adapt=True)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = param.grad.add(param, alpha=group["weight_decay"])
                if group["adapt"]:
                    update.mul_(_trust_ratio(param, update, group["trust_coefficient"]))
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param)
                buffer = state["momentum_buffer"].mul_(group["momentum"]).add_(update)
                param.add_(buffer, alpha=-group["lr"])
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam with a layer-wise trust ratio ||p|| / ||r|| (groups with `adapt=False`: AdamW-like, ratio 1)."""

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01) -> None:
        if lr <= 0 or not all(0 <= b < 1 for b in betas) or eps <= 0 or weight_decay < 0:
            raise ValueError(f"LAMB needs lr > 0, betas in [0, 1), eps > 0, weight_decay >= 0; "
                             f"got {lr}, {betas}, {eps}, {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=True))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                exp_avg = state["exp_avg"].mul_(beta1).add_(param.grad, alpha=1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                corrected_mean = exp_avg / (1 - beta1 ** state["step"])
                corrected_var = exp_avg_sq / (1 - beta2 ** state["step"])
                update = corrected_mean / (corrected_var.sqrt() + group["eps"])
                update.add_(param, alpha=group["weight_decay"])
                ratio = _trust_ratio(param, update, 1.0) if group["adapt"] else 1.0
                param.sub_(group["lr"] * ratio * update)
        return loss


def parameter_groups(modules: Iterable[nn.Module], weight_decay: float) -> list[dict]:
    """Weights (ndim >= 2) decay and adapt; biases and norm parameters do neither. Shared parameters once."""
    seen: set[int] = set()
    decay, plain = [], []
    for module in modules:
        for param in module.parameters():
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            (decay if param.ndim >= 2 else plain).append(param)
    return [dict(params=decay, weight_decay=weight_decay, adapt=True),
            dict(params=plain, weight_decay=0.0, adapt=False)]


def build_optimizer(name: str, modules: Iterable[nn.Module], lr: float, weight_decay: float,
                    momentum: float = 0.9) -> torch.optim.Optimizer:
    """The optimiser `name` over every trainable parameter of `modules` (the encoders and the loss)."""
    groups = parameter_groups(modules, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW([{k: v for k, v in g.items() if k != "adapt"} for g in groups], lr=lr)
    if name == "sgd":
        return torch.optim.SGD([{k: v for k, v in g.items() if k != "adapt"} for g in groups], lr=lr,
                               momentum=momentum)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum)
    if name == "lamb":
        return LAMB(groups, lr=lr)
    if name == "adamw8bit":
        from gradcache.train.optim.adamw8bit import (
            adamw_8bit,  # bitsandbytes: only when asked
        )

        return adamw_8bit(groups, lr)
    raise ValueError(f"--optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
