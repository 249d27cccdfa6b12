"""SpladeLoss, FLOPS and L1 against loops written from their formulas; under GradCache and CachedLoss against
FullBatch on every parameter (float64); on two gloo ranks (dense and sparse cache) against one process on the
concatenated batch."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import FlopsRegularizer, InfoNCE, L1Regularizer, SpladeLoss
from tests.conftest import assert_grads_close, grads_of, zero
from tests.multiprocess import run_on_ranks

VOCAB = 40


def sparse_rows(n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log1p(torch.relu(torch.randn(n, VOCAB, generator=g, dtype=dtype) - 0.8))


def flops_loop(w: torch.Tensor) -> float:
    n, v = w.shape
    return sum((sum(float(w[i, j]) for i in range(n)) / n) ** 2 for j in range(v))


def l1_loop(w: torch.Tensor) -> float:
    n, v = w.shape
    return sum(sum(abs(float(w[i, j])) for j in range(v)) for i in range(n)) / n


def infonce_dot_loop(q, p, negs) -> float:
    docs = [p[j] for j in range(p.shape[0])] + [negs[k] for k in range(negs.shape[0])]
    total = 0.0
    for i in range(q.shape[0]):
        scores = [float(q[i] @ d) for d in docs]
        top = max(scores)
        total -= scores[i] - (top + math.log(sum(math.exp(s - top) for s in scores)))
    return total / q.shape[0]


@pytest.mark.parametrize("n", [1, 5])
def test_regularizers_equal_their_formulas(n):
    w = sparse_rows(n, seed=n) - 0.1  # negative entries too: L1 takes |w|
    assert FlopsRegularizer()(w).item() == pytest.approx(flops_loop(w), rel=1e-12)
    assert L1Regularizer()(w).item() == pytest.approx(l1_loop(w), rel=1e-12)


@pytest.mark.parametrize("query_weight", [None, 0.3])
def test_splade_loss_and_its_parts_equal_the_formula(query_weight):
    q, p, negs = sparse_rows(6, 1), sparse_rows(6, 2), sparse_rows(12, 3)
    loss_fn = SpladeLoss(document_regularizer_weight=0.2, query_regularizer_weight=query_weight)
    value = loss_fn(q, p, negs)
    base, doc = infonce_dot_loop(q, p, negs), 0.2 * flops_loop(torch.cat([p, negs]))
    query = 0.0 if query_weight is None else query_weight * flops_loop(q)
    assert value.item() == pytest.approx(base + doc + query, rel=1e-12)
    want = {"base_loss": base, "document_regularizer_loss": doc}
    if query_weight is not None:
        want["query_regularizer_loss"] = query
    assert {k: v.item() for k, v in loss_fn.parts.items()} == pytest.approx(want, rel=1e-12)
    assert all(not v.requires_grad for v in loss_fn.parts.values())


def test_splade_loss_takes_another_base_loss_and_l1():
    q, p = sparse_rows(4, 5), sparse_rows(4, 6)
    base = InfoNCE(temperature=0.5)
    loss_fn = SpladeLoss(base, 0.1, 0.2, document_regularizer=L1Regularizer(), query_regularizer=L1Regularizer())
    want = base(q, p) + 0.1 * l1_loop(p) + 0.2 * l1_loop(q)
    torch.testing.assert_close(loss_fn(q, p), want)


@pytest.mark.parametrize("bad, match", [
    (dict(document_regularizer_weight=-1.0), "document_regularizer_weight must be >= 0"),
    (dict(document_regularizer_weight=float("nan")), "document_regularizer_weight must be a finite"),
    (dict(query_regularizer_weight=-0.5), "query_regularizer_weight must be >= 0"),
])
def test_bad_weights_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SpladeLoss(**bad)


def test_a_loss_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="document_regularizer must be a callable"):
        SpladeLoss(document_regularizer=3)


class SpladeHead(nn.Module):
    """A tiny SPLADE encoder: token vectors -> vocabulary logits -> max over tokens of log(1 + relu(.))."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.mix = nn.Linear(8, 8)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(8, VOCAB)
        with torch.no_grad():
            self.head.bias -= 0.8  # most logits negative: sparse rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, 8) -> (B, V)
        logits = self.head(self.dropout(torch.tanh(self.mix(x))))  # (B, L, V)
        return torch.log1p(torch.relu(logits)).amax(dim=1)


def splade_batch(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, 5, 8, generator=g, dtype=torch.float64) for rows in (n, n, 2 * n)]


def splade_step(strategy, encoder, loss_fn, batch, chunk_size, **options):
    zero(encoder)
    if strategy is CachedLoss:
        value = CachedLoss(encoder, loss_fn, chunk_size, **options)(*batch)
        value.backward()
        return value.detach()
    if strategy is FullBatch:
        return FullBatch(encoder, loss_fn).step(*batch)
    return strategy(encoder, loss_fn, chunk_size, **options).step(*batch)


@pytest.mark.parametrize("strategy", [GradCache, CachedLoss])
def test_cached_splade_equals_the_full_batch_on_every_parameter(strategy):
    torch.manual_seed(0)
    encoder = SpladeHead(dropout=0.1).double()
    loss_fn = SpladeLoss(document_regularizer_weight=0.5, query_regularizer_weight=0.7)
    batch = splade_batch(7)
    torch.manual_seed(3)
    want_value = splade_step(FullBatch, encoder, loss_fn, batch, None)
    want, want_parts = grads_of(encoder), dict(loss_fn.parts)
    torch.manual_seed(3)
    got_value = splade_step(strategy, encoder, loss_fn, batch, 3)
    torch.testing.assert_close(got_value, want_value, rtol=1e-10, atol=0)
    assert_grads_close(grads_of(encoder), want, 1e-8)
    for name, value in want_parts.items():
        torch.testing.assert_close(loss_fn.parts[name], value, rtol=1e-10, atol=0)


GLOBAL = 8


def ranks_worker(rank, world_size):
    torch.manual_seed(0)
    encoder = SpladeHead().double()
    wrapped = DistributedDataParallel(encoder)
    loss_fn = SpladeLoss(document_regularizer_weight=0.5, query_regularizer_weight=0.7)
    half = slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)
    q, p, n = splade_batch(GLOBAL)
    local = [q[half], p[half], n.view(GLOBAL, 2, 5, 8)[half].reshape(-1, 5, 8)]
    results = {}
    for name, strategy in (("gradcache", GradCache), ("cached", CachedLoss), ("sparse", GradCache)):
        value = splade_step(strategy, wrapped, loss_fn, local, 3, sparse_cache=name == "sparse")
        results[name] = {"loss": value, "parts": dict(loss_fn.parts), "grads": grads_of(encoder)}
    return results


@pytest.mark.slow
def test_two_ranks_regularise_the_global_batch_as_one_process_does():
    torch.manual_seed(0)
    encoder = SpladeHead().double()
    loss_fn = SpladeLoss(document_regularizer_weight=0.5, query_regularizer_weight=0.7)
    want_value = splade_step(FullBatch, encoder, loss_fn, splade_batch(GLOBAL), None)
    want, want_parts = grads_of(encoder), dict(loss_fn.parts)
    for result in run_on_ranks(ranks_worker, 2):
        for name in ("gradcache", "cached", "sparse"):
            torch.testing.assert_close(result[name]["loss"], want_value, rtol=1e-10, atol=0)
            assert_grads_close(result[name]["grads"], want, 1e-8)
            for part, value in want_parts.items():
                torch.testing.assert_close(result[name]["parts"][part], value, rtol=1e-10, atol=0)


def test_flops_threshold_drops_rows_with_few_non_zeros():
    w = sparse_rows(6, seed=9)
    counts = (w != 0).sum(dim=1)
    threshold = int(counts.median())
    kept = w * (counts > threshold).double().unsqueeze(1)
    assert FlopsRegularizer(threshold)(w).item() == pytest.approx(flops_loop(kept), rel=1e-12)
    assert 0 < int((counts > threshold).sum()) < 6
    with pytest.raises(ValueError, match="threshold must be None"):
        FlopsRegularizer(-1)
