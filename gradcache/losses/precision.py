"""Where the losses compute: float32 or wider, with autocast off, on L2-normalised rows.

A bf16 similarity matrix loses about three significant digits, which at temperature 0.01 is several nats of
logit error, so every loss upcasts its inputs and disables autocast around its own arithmetic. The casts are
ordinary autograd ops, so gradients flow back to the embeddings in their own dtype (bf16 in, bf16 grad out).
TF32 (a 10-bit mantissa for float32 matmuls on CUDA, where a user turned it on for the encoders) costs the same
digits of a logit, so it is off for the loss's forward matmuls too; the encoders and the loss's backward (run by
autograd after the block) keep the user's setting (gradcache/tf32.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from gradcache.tf32 import ieee_matmuls

__all__ = ["compute_dtype", "full_precision", "unit_rows"]


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype a loss accumulates in: float64 if any input is float64, else float32."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` and, on CUDA, TF32 for float32 matmuls (`ieee_matmuls`), so that the
    matmuls inside the loss run in the compute dtype; both as they were after."""
    precision = ieee_matmuls() if device.type == "cuda" else contextlib.nullcontext()
    with torch.autocast(device_type=device.type, enabled=False), precision:
        yield


def unit_rows(embeddings: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x_i / ||x_i||, computed in ``dtype``: (N, D) -> (N, D)."""
    return F.normalize(embeddings.to(dtype), dim=1)
