"""A frozen tower (no parameter requiring grad) is encoded once per chunk in phase (1) and never re-encoded."""
from __future__ import annotations

import torch

import gradcache.cache
from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import ClipLoss
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero


class Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def models(seed=0):
    torch.manual_seed(seed)
    image = Counting(mlp().double().eval()).requires_grad_(False)  # locked-image tuning
    text = TokenEncoder().double().eval()
    return image, text, ClipLoss(temperature=0.1, learnable=True).double()


def test_frozen_image_tower_is_encoded_once_and_gradients_match_full_batch(monkeypatch):
    batch = (torch.randn(10, 10, dtype=torch.float64), tokens(10, seed=1))
    image, text, loss = models()
    FullBatch([image, text], loss).step(*batch)
    want = grads_of(text, loss)
    captured = []
    real_capture = gradcache.cache.RandomState.capture
    monkeypatch.setattr(gradcache.cache.RandomState, "capture",
                        lambda tensors=(), devices=(): captured.append(1) or real_capture(tensors, devices))
    for strategy in ("gradcache", "cached", "budget"):
        zero(image, text, loss)
        image.calls, captured[:] = 0, []
        if strategy == "cached":
            CachedLoss([image, text], loss, 4)(*batch).backward()
        else:
            GradCache([image, text], loss, 4, memory_budget=10**9 if strategy == "budget" else None).step(*batch)
        assert image.calls == 3, strategy  # chunks of 4, 4, 2: one forward each, none in phase (3)
        assert len(captured) == 3, strategy  # random states for the text chunks only
        assert all(p.grad is None for p in image.parameters())
        assert_grads_close(grads_of(text, loss), want, 1e-12)


def test_every_tower_frozen_still_trains_the_temperature():
    batch = (torch.randn(7, 10, dtype=torch.float64), tokens(7, seed=2))
    image, text, loss = models(1)
    text.requires_grad_(False)
    FullBatch([image, text], loss).step(*batch)
    want = grads_of(loss)
    zero(loss)
    GradCache([image, text], loss, 3).step(*batch)
    assert image.calls == 1 + 3  # FullBatch's one forward, then one per chunk
    assert_grads_close(grads_of(loss), want, 1e-12)
