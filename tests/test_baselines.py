"""NaiveAccumulation is the honest baseline: the mean of per-micro-batch losses, NOT the full-batch loss."""
from __future__ import annotations

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
