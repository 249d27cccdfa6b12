"""Dropout replay: the gradient is that of the loss returned, and the caller's random stream is undisturbed."""
from __future__ import annotations

import torch

from gradcache import CachedLoss, GradCache
from gradcache.losses import NTXent
from gradcache.random_state import RandomState
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
