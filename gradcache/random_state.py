"""Capture and replay of the random state, so a re-forward draws the same dropout masks as the first pass; a
chunk whose first pass drew no random number (no dropout) keeps no state and replays as nothing."""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn


def cuda_devices_of(modules: Iterable[nn.Module]) -> frozenset[int]:
    """The CUDA devices the modules' parameters and buffers live on: an encoder on cuda:1 fed CPU tensors (raw
    text tokenised inside forward), or a model spread over GPUs (device_map="auto"), draws its dropout there.
    Found once per encoder and step, not per chunk."""
    if not torch.cuda.is_initialized():  # no CUDA generator has drawn (is_available probes the driver each call)
        return frozenset()
    return frozenset(t.device.index for m in modules for t in itertools.chain(m.parameters(), m.buffers())
                     if t.is_cuda)


def _cuda_devices(tensors: Iterable[torch.Tensor], devices: Iterable[int]) -> list[int]:
    """The CUDA devices a chunk's computation may draw random numbers on: its tensors', its encoder's
    (`devices`: `cuda_devices_of`) and the current one."""
    if not torch.cuda.is_initialized():
        return []
    found = {t.device.index for t in tensors if t.is_cuda} | set(devices)
    found.add(torch.cuda.current_device())
    return sorted(found)


@dataclass(frozen=True)
class RandomState:
    """The CPU generator state and the states of the CUDA generators a chunk may use: those of its tensors' GPUs,
    its encoder's (`capture(devices=cuda_devices_of([encoder]))`) and the current one.

    `capture` before the first forward of a chunk, `kept_if_drawn` after it, `replay` around its re-forward.
    Replaying restores the global state afterwards, so the caller's random stream is where the first pass left it.
    """

    cpu: torch.Tensor
    cuda: tuple[tuple[int, torch.Tensor], ...]

    @classmethod
    def capture(cls, tensors: Iterable[torch.Tensor] = (), devices: Iterable[int] = ()) -> RandomState:
        devices = _cuda_devices(tensors, devices)
        return cls(
            cpu=torch.get_rng_state(),
            cuda=tuple((d, torch.cuda.get_rng_state(d)) for d in devices),
        )

    def kept_if_drawn(self) -> RandomState | NoDraws:
        """This state when a generator moved since `capture` (the first pass drew random numbers, which the
        re-forward must draw again), else `NO_DRAWS`: a chunk that drew none (an encoder without dropout) keeps no
        state (5 KB of CPU generator a chunk) and its re-forward, drawing none either, needs no replay.

        A generator's state moves with every draw (the Mersenne Twister's position, Philox's offset), so an
        unmoved state means no draw from the global generators; code that draws inside `fork_rng` without
        seeding it, and so repeats the caller's stream without advancing it, is the one case this cannot see."""
        moved = not torch.equal(torch.get_rng_state(), self.cpu) or any(
            not torch.equal(torch.cuda.get_rng_state(device), state) for device, state in self.cuda)
        return self if moved else NO_DRAWS

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        devices = [d for d, _ in self.cuda]
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            self.restore()
            yield

    def restore(self) -> None:
        """Set the generators to this state, for good: inside a `replay`, which puts the caller's back after (a
        module skipped in a re-forward moves them to where its draws left them: `gradcache.reused_outputs`)."""
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda:
            torch.cuda.set_rng_state(state, device)


class NoDraws:
    """The random state of a chunk whose first pass drew no random number: nothing kept, nothing to replay."""

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        yield

    def __repr__(self) -> str:
        return "NO_DRAWS"


NO_DRAWS = NoDraws()
