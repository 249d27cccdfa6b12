"""A loaded model's weights are finite: one NaN or inf in a weight makes every output it reaches NaN, so a model
folder holding one is refused where it is loaded, before anything is encoded, evaluated or trained from it."""
from __future__ import annotations

from itertools import chain

import torch
from torch import nn

SHOWN = 3  # the tensors a message names


def non_finite_weights(module: nn.Module) -> list[tuple[str, int, int]]:
    """(name, bad count, size) of each floating parameter of `module` holding NaN or inf, and of each floating
    buffer holding NaN (a buffer may hold -inf by design: a causal attention mask), in `named_parameters` then
    `named_buffers` order; meta tensors (no values) are skipped. One host read per tensor."""
    found = []
    tensors = chain(((name, tensor, torch.isfinite) for name, tensor in module.named_parameters()),
                    ((name, tensor, lambda t: ~torch.isnan(t)) for name, tensor in module.named_buffers()))
    for name, tensor, good in tensors:
        if not tensor.is_floating_point() or tensor.is_meta or tensor.numel() == 0:
            continue
        with torch.no_grad():
            if bool(good(tensor).all()):
                continue
            found.append((name, int((~good(tensor)).sum()), tensor.numel()))
    return found


def check_finite_weights(module: nn.Module) -> None:
    """Raise ValueError naming the first tensors of `module` that hold NaN or inf, with their counts.

    Example:
        >>> check_finite_weights(HuggingFaceEncoder("/data/tiny-bert"))  # None, or ValueError naming the weight
    """
    found = non_finite_weights(module)
    if not found:
        return
    named = "; ".join(f"{name} ({bad} of {size} values)" for name, bad, size in found[:SHOWN])
    more = f", and {len(found) - SHOWN} more tensors" if len(found) > SHOWN else ""
    raise ValueError(f"its weights hold NaN or inf: {named}{more}; every embedding it gives would be NaN. Use a "
                     "copy saved before the weights went bad (a run's earlier checkpoint), or save the model again")
