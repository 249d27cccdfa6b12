"""chunk_tokens: token-budget chunks over length-sorted rows, exact against FullBatch, in the caller's order."""
from __future__ import annotations

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss, InfoNCE
from gradcache.token_chunks import padded_lengths
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero


def long_tailed(n, seed):
    """Right-padded rows, most short, one in five long: where fixed chunks carry the most padding."""
    batch = tokens(n, length=16, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    lengths = torch.where(torch.rand(n, generator=g) < 0.2, 16, torch.randint(1, 5, (n,), generator=g))
    mask = (torch.arange(16)[None, :] < lengths[:, None]).long()
    return {"input_ids": batch["input_ids"].clamp_min(1) * mask, "attention_mask": mask}


class Shapes(TokenEncoder):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def forward(self, input_ids, attention_mask):
        self.shapes.append(tuple(input_ids.shape))
        return super().forward(input_ids, attention_mask)


@pytest.mark.parametrize("strategy", ["gradcache", "cached"])
@pytest.mark.parametrize("chunk_tokens, budget", [(20, None), (1, None), (20, 3000), (1000, 10**12)])
def test_clip_text_tower_by_tokens_matches_full_batch(strategy, chunk_tokens, budget):
    torch.manual_seed(0)
    image, text = mlp().double().eval(), Shapes().double().eval()
    loss = ClipLoss(temperature=0.1, learnable=True).double()
    batch = (torch.randn(14, 10, dtype=torch.float64), long_tailed(14, seed=1))
    want_loss = FullBatch([image, text], loss).step(*batch)  # the loss pairs row i with row i: order matters
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    text.shapes.clear()
    options = dict(chunk_tokens=[None, chunk_tokens], memory_budget=budget)
    if strategy == "cached":
        got_loss = CachedLoss([image, text], loss, 5, **options)(*batch)
        got_loss.backward()
    else:
        got_loss = GradCache([image, text], loss, 5, **options).step(*batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(image, text, loss), want, 1e-12)
    for rows, length in text.shapes:
        assert rows <= 5 and (rows * length <= chunk_tokens or rows == 1)
    lengths = padded_lengths(batch[1]["attention_mask"])
    fixed = sum(int(lengths[i : i + 5].max()) * len(lengths[i : i + 5]) for i in range(0, 14, 5))  # trim_padding
    first_pass = text.shapes[: _chunks(text.shapes)]
    assert sum(rows * length for rows, length in first_pass) < fixed  # fewer padded tokens than fixed chunks


def _chunks(shapes):
    """The first pass's chunks: rows add up to the batch (14)."""
    total = 0
    for n, (rows, _) in enumerate(shapes, 1):
        total += rows
        if total == 14:
            return n
    raise AssertionError(shapes)


def test_hard_negatives_with_per_input_chunk_sizes_and_tokens():
    torch.manual_seed(2)
    encoder = TokenEncoder().double().eval()
    loss = InfoNCE(temperature=0.2)
    n, h = 9, 2
    query, positive, negatives = long_tailed(n, 3), long_tailed(n, 4), long_tailed(n * h, 5)
    want_loss = FullBatch(encoder, loss).step(query, positive, negatives)
    want = grads_of(encoder)
    zero(encoder)
    got_loss = GradCache(encoder, loss, (3, 3, 6), chunk_tokens=[12, None, 24]).step(query, positive, negatives)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)


def test_evaluation_restores_the_callers_order():
    torch.manual_seed(6)
    encoder = TokenEncoder().double().eval()
    batch = long_tailed(11, seed=7)
    seen = []
    cached = CachedLoss(encoder, lambda e: seen.append(e) or e.sum(), 4, chunk_tokens=16)
    with torch.no_grad():
        cached(batch)
        want = encoder(**batch)
    assert torch.allclose(seen[0], want, rtol=1e-12)


@pytest.mark.parametrize(
    "options, error, match",
    [({"chunk_tokens": 0}, ValueError, "chunk_tokens must be at least 1"),
     ({"chunk_tokens": 2.5}, TypeError, "chunk_tokens must be an int"),
     ({"chunk_tokens": [None, -1]}, ValueError, r"chunk_tokens\[1\] must be at least 1"),
     ({"chunk_tokens": []}, ValueError, "chunk_tokens is an empty sequence"),
     ({"memory_budget": -1}, ValueError, "memory_budget must be >= 0 bytes, got -1"),
     ({"memory_budget": 1.5}, TypeError, "memory_budget must be an int"),
     ({"memory_budget": True}, TypeError, "memory_budget must be an int")],
)
def test_bad_options_raise_in_the_constructor(options, error, match):
    for cls in (GradCache, CachedLoss):
        with pytest.raises(error, match=match):
            cls(mlp(), ClipLoss(), 4, **options)


def test_chunk_tokens_on_an_input_without_attention_mask_raises_before_anything_runs():
    image, text = mlp(), TokenEncoder()
    calls = []
    image.register_forward_hook(lambda *args: calls.append(1))
    batch = (torch.randn(4, 10), tokens(4))
    with pytest.raises(ValueError, match=r"chunk_tokens=8 applies to input 0.*chunk_tokens=\[None, 4096\]"):
        GradCache([image, text], ClipLoss(), 2, chunk_tokens=8).step(*batch)
    with pytest.raises(ValueError, match="chunk_tokens has 3 entries for 2 inputs"):
        GradCache([image, text], ClipLoss(), 2, chunk_tokens=[None, 8, 8]).step(*batch)
    assert calls == [] and all(p.grad is None for p in image.parameters())


def test_naive_accumulation_refuses_chunk_tokens():
    with pytest.raises(ValueError, match="NaiveAccumulation does not take chunk_tokens=64.*micro-batch"):
        NaiveAccumulation(mlp(), ClipLoss(), 4, chunk_tokens=64)
