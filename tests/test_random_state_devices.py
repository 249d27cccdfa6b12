"""Dropout replay on a GPU that is neither the current one nor the chunk's (issue 39 item 2), without a GPU:
torch.cuda's generator API is mocked by two fake GPUs whose generators are one number each, and an encoder draws
its mask from GPU 1's generator while its inputs stay on the CPU (raw text tokenised inside forward, a
device_map="auto" model). The captured state must cover the GPUs of the encoder's parameters and buffers, so phase
(3) redraws phase (1)'s masks: the recompute check passes and the gradient is that of the forward with a graph."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, GradCache
from gradcache.losses import NTXent
from gradcache.random_state import RandomState, cuda_devices_of
from tests.conftest import assert_grads_close, grads_of, zero


class FakeGenerators:
    """GPUs 0, 1 and 2, the current one 0, each generator's state a one-element tensor that a draw advances."""

    def __init__(self) -> None:
        self.states = {index: torch.tensor([seed], dtype=torch.uint8) for index, seed in enumerate((100, 7, 50))}

    def get(self, device=0):
        return self.states[torch.device("cuda", device).index].clone()

    def set(self, state, device=0):
        self.states[torch.device("cuda", device).index] = state.clone()

    @contextlib.contextmanager
    def installed(self):
        with mock.patch("torch.cuda.is_initialized", return_value=True), \
                mock.patch("torch.cuda.current_device", return_value=0), \
                mock.patch("torch.cuda.device_count", return_value=3), \
                mock.patch("torch.cuda.get_rng_state", side_effect=self.get), \
                mock.patch("torch.cuda.set_rng_state", side_effect=self.set):
            yield self


class DrawsOnGpu1(nn.Module):
    """A linear layer behind a dropout mask drawn from GPU 1's generator (one draw a forward)."""

    def __init__(self, generators: FakeGenerators) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5).double()
        self.generators = generators

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = torch.cuda.get_rng_state(1)
        torch.cuda.set_rng_state(state + 1, 1)  # the draw moves the generator
        mask = torch.rand(x.shape, generator=torch.Generator().manual_seed(int(state[0]))) > 0.5
        return self.linear(x * mask / 0.5)


def _on_gpu(index: int) -> SimpleNamespace:
    return SimpleNamespace(is_cuda=True, device=torch.device("cuda", index))


class Spread(nn.Module):
    """A model whose parameters report GPU 1 and whose buffers report GPU 2 (device_map="auto")."""

    def parameters(self, recurse: bool = True):
        return iter([_on_gpu(1), torch.zeros(1)])

    def buffers(self, recurse: bool = True):
        return iter([_on_gpu(2)])


def test_the_devices_of_an_encoders_parameters_and_buffers_are_found():
    with FakeGenerators().installed():
        assert cuda_devices_of([Spread()]) == {1, 2}
        assert cuda_devices_of([nn.Linear(2, 2)]) == frozenset()
        assert [d for d, _ in RandomState.capture((), cuda_devices_of([Spread()])).cuda] == [0, 1, 2]
    assert cuda_devices_of([Spread()]) == frozenset()  # CUDA never initialised: no generator to capture


@pytest.mark.parametrize("strategy", ["step", "cached"])
def test_dropout_drawn_on_the_encoders_gpu_is_replayed(monkeypatch, strategy):
    generators = FakeGenerators()
    encoder = DrawsOnGpu1(generators)
    monkeypatch.setattr("gradcache.cache.cuda_devices_of", lambda modules: frozenset({1}))  # it lives on GPU 1
    loss = NTXent()
    views = tuple(torch.randn(2, 8, 6, dtype=torch.float64))
    with generators.installed():
        start = generators.get(1)
        want_loss = loss(*[torch.cat([encoder(c) for c in v.split(3)]) for v in views])
        want_loss.backward()
        want, after = grads_of(encoder), generators.get(1)
        zero(encoder)
        generators.set(start, 1)
        if strategy == "step":
            got_loss = GradCache(encoder, loss, 3).step(*views)  # the recompute check on: it raised before
        else:
            got_loss = CachedLoss(encoder, loss, 3)(*views)
            got_loss.backward()
        assert torch.equal(generators.get(1), after)  # the caller's stream where the first pass left it
    assert torch.allclose(got_loss.detach(), want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)
