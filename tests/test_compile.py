"""A torch.compile'd encoder (backend aot_eager: no C++ compiler needed) with every strategy and option."""
from __future__ import annotations

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero

pytestmark = pytest.mark.slow  # compiling the towers takes most of the module's time


@pytest.fixture(scope="module")
def compiled():
    """One pair of compiled towers for every case (compiling is the slow part); the eager ones they wrap."""
    torch.manual_seed(0)
    image, text = mlp(), TokenEncoder().eval()
    loss = ClipLoss(temperature=0.1, learnable=True)
    towers = [torch.compile(image, backend="aot_eager", dynamic=True),
              torch.compile(text, backend="aot_eager", dynamic=True)]
    return towers, (image, text, loss)


CASES = {
    "gradcache": (GradCache, {}),
    "budget": (GradCache, {"memory_budget": 2500}),
    "tokens": (GradCache, {"chunk_tokens": [None, 24], "memory_budget": 10**9}),
    "cached": (CachedLoss, {"trim_padding": True}),
    "naive": (NaiveAccumulation, {}),
    "full": (FullBatch, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_encoders_give_the_eager_gradient(compiled, case):
    towers, (image, text, loss) = compiled
    batch = (torch.randn(10, 10), tokens(10, seed=1))
    cls, options = CASES[case]
    eager_reference = NaiveAccumulation if cls is NaiveAccumulation else FullBatch
    zero(image, text, loss)
    want_loss = eager_reference([image, text], loss, 4).step(*batch)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    if cls is CachedLoss:
        got_loss = cls(towers, loss, 4, **options)(*batch)
        got_loss.backward()
    else:
        got_loss = cls(towers, loss, 4, **options).step(*batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_grads_close(grads_of(image, text, loss), want, 1e-5)


def test_compiled_encoder_with_dropout_replays_its_masks(compiled):
    """Dropout inside the compiled graph draws from the replayed generator: every budget, one gradient."""
    torch.manual_seed(2)
    encoder = mlp(dropout=0.3)
    tower = torch.compile(encoder, backend="aot_eager", dynamic=True)
    views = tuple(torch.randn(2, 9, 10))
    results = []
    for budget in (None, 10**9):
        zero(encoder)
        torch.manual_seed(3)
        GradCache(tower, ClipLoss(), 3, memory_budget=budget).step(*views)
        results.append(grads_of(encoder))
    zero(encoder)
    torch.manual_seed(3)
    GradCache(encoder, ClipLoss(), 3).step(*views)  # eager
    assert_grads_close(results[0], grads_of(encoder), 1e-5)
    assert_grads_close(results[1], grads_of(encoder), 1e-5)
