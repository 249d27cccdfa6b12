"""TensorFloat-32 on CUDA: whether float32 matmuls (cuBLAS) and cuDNN convolutions and RNNs may round their
inputs to TF32's 10-bit mantissa, which moves a float32 result by about 1e-3 of its scale instead of 1e-6.

torch has two APIs for it. The current one, `torch.backends.cuda.matmul.fp32_precision`,
`torch.backends.cudnn.conv.fp32_precision` and `torch.backends.cudnn.rnn.fp32_precision` ("tf32" on, "ieee" or
"none" off; torch >= 2.9), reports what the legacy one set too (`allow_tf32`, `set_float32_matmul_precision`).
The legacy getters raise ("mix of the legacy and new APIs") once the current API set a value, so the current API is
the one read here wherever torch has it, and the legacy one only on a torch without it. Defaults: matmuls off,
cuDNN on.

    tf32_in_use(encoder)   the recompute check's question: may this encoder's float32 forward have run in TF32?
    ieee_matmuls()         float32 matmuls in true float32 inside the block (the losses' logits), restored after
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["tf32_enabled", "tf32_in_use", "ieee_matmuls"]

# the operations TF32 applies to -> where torch's current API keeps each one's precision
_CURRENT_API = {
    "matmul": lambda: torch.backends.cuda.matmul,
    "conv": lambda: torch.backends.cudnn.conv,
    "rnn": lambda: torch.backends.cudnn.rnn,
}
_FULL = ("ieee", "none")  # the current API's values that keep float32 (none: the parent's, off by default)
# the modules whose forward runs on cuDNN, whose TF32 switch is on by default
_CUDNN_MODULES = {"conv": nn.modules.conv._ConvNd, "rnn": nn.RNNBase}


def _has_current_api() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_enabled(operation: str) -> bool:
    """Whether float32 `operation` ("matmul", "conv" or "rnn") may run in TF32 on CUDA, by whichever API set it."""
    if operation not in _CURRENT_API:
        raise ValueError(f"operation={operation!r} is not one of {sorted(_CURRENT_API)}")
    if _has_current_api():
        return _CURRENT_API[operation]().fp32_precision not in _FULL
    if operation == "matmul":
        return torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return torch.backends.cudnn.allow_tf32


def tf32_in_use(encoder: nn.Module) -> bool:
    """Whether `encoder`'s float32 forward on CUDA may have run in TF32: matmuls allowed it, or cuDNN did and the
    encoder holds a module cuDNN runs (a convolution, an RNN). A convolution called through torch.nn.functional
    is not seen: give such an encoder's check a tolerance (`check_recompute=1e-3`)."""
    if tf32_enabled("matmul"):
        return True
    return any(tf32_enabled(operation) and any(isinstance(m, kind) for m in encoder.modules())
               for operation, kind in _CUDNN_MODULES.items())


@contextlib.contextmanager
def ieee_matmuls() -> Iterator[None]:
    """Float32 matmuls in true float32 inside the block, the precision as it was after; nothing is changed where
    TF32 is off for them already (the default). Set through the API the process set it with: the legacy setter
    (which updates both APIs' records) where the two agree, else the current one alone, so a legacy getter that
    read before reads after."""
    if not tf32_enabled("matmul"):
        yield
        return
    legacy = _legacy_matmul_precision()
    if legacy is not None:
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(legacy)
        return
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def _legacy_matmul_precision() -> str | None:
    """`torch.get_float32_matmul_precision()`, or None where the current API set a value the legacy one does not
    record (torch then raises on the legacy read)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None
