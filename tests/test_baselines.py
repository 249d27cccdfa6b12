"""NaiveAccumulation is the honest baseline: the mean of per-micro-batch losses, NOT the full-batch loss."""
from __future__ import annotations

import pytest
import torch

from gradcache import FullBatch, NaiveAccumulation
from gradcache.losses import InfoNCE
from tests.conftest import assert_grads_close, grads_of, mlp, zero


def test_naive_accumulation_equals_mean_of_per_chunk_losses_and_differs_from_full_batch():
    torch.manual_seed(0)
    query, passage = mlp().double().eval(), mlp().double().eval()
    loss = InfoNCE(temperature=0.1)
    q, p = torch.randn(2, 12, 10, dtype=torch.float64)
    chunk = 4

    # reference written out: each micro-batch's loss within the micro-batch, averaged
    zero(query, passage)
    per_chunk = [loss(query(qc), passage(pc)) for qc, pc in zip(q.split(chunk), p.split(chunk))]
    mean_loss = torch.stack(per_chunk).mean()
    mean_loss.backward()
    want = grads_of(query, passage)

    zero(query, passage)
    got_loss = NaiveAccumulation([query, passage], loss, chunk).step(q, p)
    assert torch.allclose(got_loss, mean_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(query, passage), want, 1e-12)

    # the negative control: not the large batch
    zero(query, passage)
    full_loss = FullBatch([query, passage], loss).step(q, p)
    full = grads_of(query, passage)
    assert not torch.allclose(full_loss, got_loss, rtol=1e-3)
    assert max((full[k] - want[k]).abs().max().item() for k in full) > 1e-3


def test_naive_accumulation_with_one_chunk_is_the_full_batch():
    torch.manual_seed(1)
    encoder = mlp().double().eval()
    loss = InfoNCE()
    q, p = torch.randn(2, 6, 10, dtype=torch.float64)
    zero(encoder)
    want_loss = FullBatch(encoder, loss).step(q, p)
    want = grads_of(encoder)
    zero(encoder)
    got_loss = NaiveAccumulation(encoder, loss, 6).step(q, p)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)


class _RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises: an error in the synchronising backward itself, after the held gradients
    are back in .grad."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed")


@pytest.mark.parametrize("chunk", [3, 6])  # two micro-batches, and one (the held .grad copied, not written)
def test_naive_accumulation_adds_to_held_gradients_and_puts_them_back_exactly_on_error(chunk):
    torch.manual_seed(2)
    encoder = mlp().double().eval()
    loss = InfoNCE()
    q, p = torch.randn(2, 6, 10, dtype=torch.float64)
    zero(encoder)
    NaiveAccumulation(encoder, loss, chunk).step(q, p)
    once = grads_of(encoder)

    zero(encoder)
    for parameter in encoder.parameters():
        parameter.grad = torch.full_like(parameter, 0.5)
    held = [parameter.grad for parameter in encoder.parameters()]
    NaiveAccumulation(encoder, loss, chunk).step(q, p)
    assert_grads_close(grads_of(encoder), {k: v + 0.5 for k, v in once.items()}, 1e-12)
    assert all(bool((h == 0.5).all()) for h in held)  # accumulated into a new tensor, the held one unchanged

    calls = []

    def failing(a, b):  # the last micro-batch's backward raises
        calls.append(1)
        return loss(_RaiseInBackward.apply(a) if len(calls) == 6 // chunk else a, b)

    before = grads_of(encoder)
    objects = [parameter.grad for parameter in encoder.parameters()]
    with pytest.raises(RuntimeError, match="backward failed"):
        NaiveAccumulation(encoder, failing, chunk).step(q, p)
    assert all(parameter.grad is held for parameter, held in zip(encoder.parameters(), objects))
    assert_grads_close(grads_of(encoder), before, 0.0)
