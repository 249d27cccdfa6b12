"""Dropout replay: the gradient is that of the loss returned, and the caller's random stream is undisturbed."""
from __future__ import annotations

import torch

from gradcache import CachedLoss, GradCache
from gradcache.losses import NTXent
from gradcache.random_state import NO_DRAWS, RandomState
from tests.conftest import assert_grads_close, grads_of, mlp, zero


def test_replay_draws_the_same_numbers_and_restores_the_global_state():
    torch.manual_seed(0)
    state = RandomState.capture()
    first = torch.rand(5)
    after_first = torch.get_rng_state()
    with state.replay():
        again = torch.rand(5)
    assert torch.equal(first, again)
    assert torch.equal(torch.get_rng_state(), after_first)


def test_a_state_is_kept_only_when_a_generator_moved():
    state = RandomState.capture()
    torch.ones(3) * 2  # no draw
    assert state.kept_if_drawn() is NO_DRAWS
    torch.rand(1)
    assert state.kept_if_drawn() is state
    before = torch.get_rng_state()
    with NO_DRAWS.replay():
        pass
    assert torch.equal(torch.get_rng_state(), before)


class DropoutOnFullChunks(torch.nn.Module):
    """Dropout on chunks of `rows` rows only: the chunks of one input alternate between drawing and not."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.body, self.rows = mlp(dropout=0.0), rows
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.body(x)) if x.shape[0] == self.rows else self.body(x)


def test_chunks_that_draw_nothing_keep_no_state_and_stay_exact(monkeypatch):
    """Chunks of 3, 3, 3, 1 rows: the three full ones draw dropout masks and are replayed, the last draws none and
    is re-encoded without a replay; the gradient is the chunked forward's with a graph, and the caller's stream is
    where that forward left it."""
    encoder = DropoutOnFullChunks(3).double().train()
    loss = NTXent()
    views = tuple(torch.randn(2, 10, 10, dtype=torch.float64))
    torch.manual_seed(7)
    want_loss = chunked_forward_with_graph(encoder, views, 3, loss)
    want_loss.backward()
    want, want_state = grads_of(encoder), torch.get_rng_state()

    kept = []
    capture = RandomState.kept_if_drawn
    monkeypatch.setattr(RandomState, "kept_if_drawn", lambda self: kept.append(capture(self)) or kept[-1])
    torch.manual_seed(7)
    zero(encoder)
    got_loss = GradCache(encoder, loss, 3).step(*views)
    assert torch.allclose(got_loss, want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)
    assert torch.equal(torch.get_rng_state(), want_state)
    assert [state is NO_DRAWS for state in kept] == [False, False, False, True] * 2


def test_an_encoder_without_dropout_is_never_replayed(monkeypatch):
    encoder = mlp(dropout=0.0).double().train()
    views = tuple(torch.randn(2, 10, 10, dtype=torch.float64))
    want_loss = chunked_forward_with_graph(encoder, views, 3, NTXent())
    want_loss.backward()
    want = grads_of(encoder)
    zero(encoder)
    restored = []
    monkeypatch.setattr(torch, "set_rng_state", lambda state: restored.append(state))
    got_loss = GradCache(encoder, NTXent(), 3).step(*views)
    assert restored == []
    assert torch.allclose(got_loss, want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)


def chunked_forward_with_graph(encoder, views, chunk_size, loss):
    """The reference: a chunked forward WITH a graph, in the same order GradCache's first pass uses."""
    embeddings = [torch.cat([encoder(c) for c in v.split(chunk_size)]) for v in views]
    return loss(*embeddings)


def test_dropout_is_replayed_chunk_by_chunk():
    encoder = mlp(dropout=0.5).double().train()
    loss = NTXent()
    views = tuple(torch.randn(2, 10, 10, dtype=torch.float64))
    for strategy in ("step", "cached"):
        torch.manual_seed(123)
        zero(encoder)
        want_loss = chunked_forward_with_graph(encoder, views, 3, loss)
        want_loss.backward()
        want, want_state = grads_of(encoder), torch.get_rng_state()

        torch.manual_seed(123)
        zero(encoder)
        if strategy == "step":
            got_loss = GradCache(encoder, loss, 3).step(*views)
        else:
            got_loss = CachedLoss(encoder, loss, 3)(*views)
            got_loss.backward()
        assert torch.allclose(got_loss, want_loss.detach(), rtol=1e-12), strategy
        assert_grads_close(grads_of(encoder), want, 1e-12)
        # after the step the global state is where the first pass left it (= after one chunked forward)
        assert torch.equal(torch.get_rng_state(), want_state), strategy


def test_dropout_without_replay_would_differ():
    """The control: a second pass that draws fresh masks gives another gradient, so the test above can fail."""
    encoder = mlp(dropout=0.5).double().train()
    loss = NTXent()
    views = tuple(torch.randn(2, 10, 10, dtype=torch.float64))
    torch.manual_seed(123)
    zero(encoder)
    chunked_forward_with_graph(encoder, views, 3, loss).backward()
    first = grads_of(encoder)
    zero(encoder)
    chunked_forward_with_graph(encoder, views, 3, loss).backward()  # fresh masks
    second = grads_of(encoder)
    assert any((first[k] - second[k]).abs().max() > 1e-6 for k in first)
