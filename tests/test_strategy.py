"""Bad input gets a clear ValueError or TypeError naming the argument, before any gradient is touched."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation, NonFiniteLossError
from gradcache.losses import InfoNCE, NTXent
from tests.conftest import TokenEncoder, grads_of, mlp, tokens

CHUNKED = [GradCache, CachedLoss, NaiveAccumulation]


@pytest.mark.parametrize("cls", CHUNKED)
@pytest.mark.parametrize(
    "chunk_size, error, match",
    [(0, ValueError, "at least 1"), (-3, ValueError, "at least 1"), (2.5, TypeError, "must be an int"),
     (True, TypeError, "must be an int"), ("8", TypeError, "must be an int"), ([4, 0], ValueError, r"chunk_size\[1\]")],
)
def test_bad_chunk_size(cls, chunk_size, error, match):
    with pytest.raises(error, match=match):
        cls(mlp(), NTXent(), chunk_size)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [({"autocast_dtype": torch.float32}, ValueError, "autocast_dtype"), ({"scaler": 2.0}, TypeError, "scaler"),
     ({"get_embedding": "pooler"}, TypeError, "get_embedding"), ({"split_fn": 3}, TypeError, "split_fn"),
     ({"trim_padding": "yes"}, TypeError, "trim_padding"), ({"gather": 1}, TypeError, "gather")],
)
def test_bad_options(kwargs, error, match):
    for cls in CHUNKED:
        with pytest.raises(error, match=match):
            cls(mlp(), NTXent(), 4, **kwargs)
    with pytest.raises(error, match=match):
        FullBatch(mlp(), NTXent(), **kwargs)


def test_bad_encoders_and_loss():
    with pytest.raises(TypeError, match="encoders"):
        GradCache([], NTXent(), 4)
    with pytest.raises(TypeError, match="encoders"):
        GradCache([mlp(), "tower"], NTXent(), 4)
    with pytest.raises(TypeError, match="loss_fn"):
        GradCache(mlp(), "infonce", 4)


def untouched(step, modules, error, match):
    """The step raises, and every .grad is as it was before (here: a marker value)."""
    for module in modules:
        for p in module.parameters():
            p.grad = torch.full_like(p, 7.0)
    before = grads_of(*modules)
    with pytest.raises(error, match=match):
        step()
    after = grads_of(*modules)
    for k in before:
        assert torch.equal(before[k], after[k]), k


@pytest.mark.parametrize("cls", CHUNKED + [FullBatch])
def test_bad_step_inputs_leave_grads_untouched(cls):
    image, text = mlp(), TokenEncoder()
    loss = NTXent()
    two = cls([image, text], loss, 4)
    batch = tokens(6)
    step = (lambda *a, **k: two(*a, **k).backward()) if cls is CachedLoss else two.step
    untouched(lambda: step(torch.randn(6, 10)), [image, text], ValueError, "1 inputs for 2 encoders")
    ragged = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"][:5]}
    untouched(lambda: step(torch.randn(6, 10), ragged), [image, text], ValueError, "input_ids: 6, attention_mask: 5")
    untouched(lambda: step(torch.randn(0, 10), tokens(0)), [image, text], ValueError, "empty batch")
    if cls is not CachedLoss:  # CachedLoss under no_grad is an evaluation call, tested elsewhere
        with torch.no_grad():
            untouched(lambda: step(torch.randn(6, 10), batch), [image, text], ValueError, "gradients disabled")


def test_chunk_size_count_must_match_inputs():
    cache = GradCache(mlp(), NTXent(), [4, 4, 4])
    with pytest.raises(ValueError, match="3 entries for 2 inputs"):
        cache.step(torch.randn(6, 10), torch.randn(6, 10))


@pytest.mark.parametrize("cls", CHUNKED + [FullBatch])
def test_encoder_output_that_is_not_a_floating_tensor(cls):
    class Ids(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(10, 6)

        def forward(self, x):
            return {"embedding": self.linear(x)}

    encoder = Ids()
    strategy = cls(encoder, NTXent(), 4)
    run = (lambda: strategy(torch.randn(6, 10), torch.randn(6, 10)).backward()) if cls is CachedLoss else (
        lambda: strategy.step(torch.randn(6, 10), torch.randn(6, 10)))
    untouched(run, [encoder], TypeError, "get_embedding")


@pytest.mark.parametrize("cls", CHUNKED + [FullBatch])
def test_non_finite_loss_names_the_step_and_leaves_grads(cls):
    encoder = mlp()
    calls = []

    def exploding(a, b):
        calls.append(1)
        value = (a * b).sum(1).mean()
        return value * float("nan") if len(calls) >= 2 else value  # micro-batch 2 of NaiveAccumulation

    strategy = cls(encoder, exploding, 3)
    run = (lambda: strategy(torch.randn(6, 10), torch.randn(6, 10)).backward()) if cls is CachedLoss else (
        lambda: strategy.step(torch.randn(6, 10), torch.randn(6, 10)))
    if cls is not NaiveAccumulation:
        run()  # step 1 is finite
        for p in encoder.parameters():
            p.grad = None
    untouched(run, [encoder], NonFiniteLossError,
              "non-finite loss .* at step 2" if cls is not NaiveAccumulation else "micro-batch 2 of 2")


def test_loss_that_is_not_a_scalar():
    encoder = mlp()
    untouched(lambda: GradCache(encoder, lambda a, b: a - b, 4).step(torch.randn(6, 10), torch.randn(6, 10)),
              [encoder], ValueError, "scalar")


@pytest.mark.parametrize("cls", CHUNKED + [FullBatch])
@pytest.mark.parametrize("loss_fn", [lambda a, b: torch.tensor(1.0), lambda a, b: (a * b).sum().detach()],
                         ids=["constant", "detached"])
def test_a_loss_that_does_not_depend_on_the_embeddings_names_loss_fn(cls, loss_fn):
    encoder = mlp()
    strategy = cls(encoder, loss_fn, 3)
    run = (lambda: strategy(torch.randn(6, 10), torch.randn(6, 10)).backward()) if cls is CachedLoss else (
        lambda: strategy.step(torch.randn(6, 10), torch.randn(6, 10)))
    untouched(run, [encoder], ValueError, "loss_fn returned a loss that does not depend on the embeddings")
    with pytest.raises(ValueError, match=r"\.detach\(\)"):  # what to look for in loss_fn
        run()


def test_infonce_negatives_not_a_multiple_of_queries():
    encoder = mlp()
    untouched(lambda: GradCache(encoder, InfoNCE(), 4).step(torch.randn(6, 10), torch.randn(6, 10), torch.randn(7, 10)),
              [encoder], ValueError, "negatives")


def test_naive_needs_the_same_number_of_micro_batches_per_input():
    encoder = mlp()
    untouched(lambda: NaiveAccumulation(encoder, NTXent(), [2, 3]).step(torch.randn(6, 10), torch.randn(6, 10)),
              [encoder], ValueError, r"different numbers of micro-batches \(\[3, 2\]\)")


def test_options_are_spelled_once():
    """One signature: no strategy re-spells the constructor; the typed options and their defaults agree."""
    from gradcache.options import DEFAULTS, Options
    from gradcache.strategy import Strategy

    for cls in (GradCache, FullBatch, NaiveAccumulation):
        assert cls.__init__ is Strategy.__init__, cls
    assert set(DEFAULTS) == set(Options.__annotations__)
    assert GradCache.chunk_size_required and NaiveAccumulation.chunk_size_required
    assert not FullBatch.chunk_size_required
    assert FullBatch(mlp(), NTXent(), 8).chunk_size is None  # accepted and ignored


@pytest.mark.parametrize("cls", [GradCache, CachedLoss, NaiveAccumulation, FullBatch])
def test_unknown_option_names_the_valid_ones(cls):
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['trim_pading'\].*'trim_padding'"):
        cls(mlp(), NTXent(), 4, trim_pading=True)


@pytest.mark.parametrize("cls", [GradCache, NaiveAccumulation])
def test_chunk_size_is_required_where_it_means_something(cls):
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        cls(mlp(), NTXent())


def test_cached_loss_refuses_a_scaler_it_could_not_honour():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    with pytest.raises(TypeError, match=r"scaler.*scaler\.scale\(loss\)\.backward\(\)"):
        CachedLoss(mlp(), NTXent(), 4, scaler=scaler)
    CachedLoss(mlp(), NTXent(), 4, scaler=None)  # None swaps in one line with the other strategies
