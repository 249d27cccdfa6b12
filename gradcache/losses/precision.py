"""Where the losses compute: float32 or wider, with autocast off, on L2-normalised rows.

A bf16 similarity matrix loses about three significant digits, which at temperature 0.01 is several nats of
logit error, so every loss upcasts its inputs and disables autocast around its own arithmetic. The casts are
ordinary autograd ops, so gradients flow back to the embeddings in their own dtype (bf16 in, bf16 grad out).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["compute_dtype", "full_precision", "unit_rows"]


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype a loss accumulates in: float64 if any input is float64, else float32."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` so that matmuls inside the loss stay in the compute dtype."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def unit_rows(embeddings: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x_i / ||x_i||, computed in ``dtype``: (N, D) -> (N, D)."""
    return F.normalize(embeddings.to(dtype), dim=1)
