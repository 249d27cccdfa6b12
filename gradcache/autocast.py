"""The autocast state of a forward pass, recorded so that a re-forward runs under exactly the same one.

Autocast is thread-local and training loops call `backward()` outside their `torch.autocast` block, so the
second pass of GradCache cannot rely on the ambient state: it re-enters the state recorded in the first pass.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_DEVICE_TYPES = ("cpu", "cuda")
HALF_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class AutocastState:
    """For each device type: (enabled, dtype), plus the autocast cache flag."""

    devices: tuple[tuple[str, bool, torch.dtype], ...]
    cache_enabled: bool

    @classmethod
    def capture(cls) -> AutocastState:
        return cls(
            devices=tuple(
                (d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES
            ),
            cache_enabled=torch.is_autocast_cache_enabled(),
        )

    @contextlib.contextmanager
    def apply(self) -> Iterator[None]:
        """Enter the recorded state, enabling or disabling autocast per device type as it was."""
        with contextlib.ExitStack() as stack:
            for device_type, enabled, dtype in self.devices:
                stack.enter_context(
                    torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=self.cache_enabled)
                )
            yield


def compute_device_type(parameter: torch.Tensor) -> str:
    """The device type `parameter` computes on, which autocast must name: its own, or for a DTensor (FSDP2) its
    mesh's, since FSDP2's CPU offload keeps the shards on the CPU while the forward runs on the GPU."""
    mesh = getattr(parameter, "device_mesh", None)
    return mesh.device_type if mesh is not None else parameter.device.type


def autocast_context(dtype: torch.dtype | None, device_type: str) -> contextlib.AbstractContextManager:
    """`torch.autocast(device_type, dtype)` when a dtype is given, else leave the caller's state alone."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


@contextlib.contextmanager
def autocast_off_everywhere() -> Iterator[None]:
    """Autocast off on every device type, whatever the caller entered: the strategies' loss and backward run
    in the embeddings' own (float32) dtype. (The losses' `gradcache.losses.precision.full_precision(device)`
    is the narrower switch for one device inside a loss.)"""
    with contextlib.ExitStack() as stack:
        for device_type in _DEVICE_TYPES:
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def upcast(embedding: torch.Tensor) -> torch.Tensor:
    """Half-precision embeddings become float32 for the loss; float32 and float64 stay as they are."""
    return embedding.float() if embedding.dtype in HALF_DTYPES else embedding
