"""Capture and replay of the random state, so a re-forward draws the same dropout masks as the first pass."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


def _cuda_devices(tensors: Iterable[torch.Tensor]) -> list[int]:
    """The CUDA devices a chunk's computation may draw random numbers on: its tensors' and the current one."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    devices = {t.device.index for t in tensors if t.is_cuda}
    devices.add(torch.cuda.current_device())
    return sorted(devices)


@dataclass(frozen=True)
class RandomState:
    """The CPU generator state and the states of the CUDA generators a chunk may use.

    `capture` before the first forward of a chunk; `replay` around its re-forward. Replaying restores the
    global state afterwards, so the caller's random stream is where the first pass left it.
    """

    cpu: torch.Tensor
    cuda: tuple[tuple[int, torch.Tensor], ...]

    @classmethod
    def capture(cls, tensors: Iterable[torch.Tensor] = ()) -> RandomState:
        devices = _cuda_devices(tensors)
        return cls(
            cpu=torch.get_rng_state(),
            cuda=tuple((d, torch.cuda.get_rng_state(d)) for d in devices),
        )

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        devices = [d for d, _ in self.cuda]
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            torch.set_rng_state(self.cpu)
            for device, state in self.cuda:
                torch.cuda.set_rng_state(state, device)
            yield
