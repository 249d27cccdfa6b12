"""sparse_cache=True: phase (1)'s (B, V) rows kept by their non-zeros and the gradient kept only there. Exact against
the dense cache and FullBatch on every parameter (float64); the cache's bytes scale with the non-zeros; refused
(ValueError) for outputs with negative values and beside chunk_tokens."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import SpladeLoss
from gradcache.sparse_rows import SparseRows
from tests.conftest import assert_grads_close, grads_of, zero

VOCAB = 60


class Splade(nn.Module):
    """Token ids -> BERT-like token vectors -> vocabulary logits -> max over tokens of log(1 + relu(.)), the
    head's bias lowered by `shift` (the larger, the sparser the rows)."""

    def __init__(self, shift: float, dropout: float = 0.0, activation=None) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 12)
        self.mix = nn.Linear(12, 12)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(12, VOCAB)
        self.activation = activation or (lambda x: torch.log1p(torch.relu(x)))
        with torch.no_grad():
            self.head.bias -= shift

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.dropout(torch.tanh(self.mix(self.embed(input_ids)))))  # (B, L, V)
        pooled = self.activation(logits) * attention_mask.unsqueeze(-1)
        return pooled.amax(dim=1)  # (B, V)


def batch(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    columns = []
    for rows in (n, n, 2 * n):  # queries, positives, two hard negatives each
        ids = torch.randint(1, 30, (rows, 7), generator=g)
        mask = (torch.arange(7) < torch.randint(2, 8, (rows, 1), generator=g)).long()
        columns.append({"input_ids": ids * mask, "attention_mask": mask})
    return columns


def step(strategy, encoder, loss_fn, inputs, **options):
    zero(encoder)
    torch.manual_seed(5)
    if strategy is FullBatch:
        return FullBatch(encoder, loss_fn).step(*inputs), grads_of(encoder)
    if strategy is CachedLoss:
        value = CachedLoss(encoder, loss_fn, 3, **options)(*inputs)
        value.backward()
        return value.detach(), grads_of(encoder)
    return strategy(encoder, loss_fn, 3, **options).step(*inputs), grads_of(encoder)


@pytest.mark.parametrize("strategy, options", [
    (GradCache, {}), (CachedLoss, {}), (GradCache, {"memory_budget": 20_000}), (GradCache, {"trim_padding": True}),
])
def test_sparse_cache_equals_the_dense_cache_and_the_full_batch(strategy, options):
    torch.manual_seed(0)
    dropout = 0.0 if options.get("trim_padding") else 0.1  # trimmed chunks draw other dropout masks than the full batch
    encoder = Splade(shift=0.4, dropout=dropout).double()
    loss_fn = SpladeLoss(document_regularizer_weight=0.3, query_regularizer_weight=0.4)
    inputs = batch(7)
    full_value, full = step(FullBatch, encoder, loss_fn, inputs)
    dense_value, dense = step(strategy, encoder, loss_fn, inputs, **options)
    sparse_value, sparse = step(strategy, encoder, loss_fn, inputs, sparse_cache=True, **options)
    torch.testing.assert_close(sparse_value, dense_value, rtol=1e-12, atol=0)
    torch.testing.assert_close(sparse_value, full_value, rtol=1e-10, atol=0)
    assert_grads_close(sparse, dense, 1e-10)
    assert_grads_close(sparse, full, 1e-8)


def cache_of(loss: torch.Tensor):
    """What phase (3) will read: the `_Replay` the bridge holds, found by walking the loss's graph."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "replay", None) is not None:
            return node.replay
        todo.extend(next_node for next_node, _ in node.next_functions)
    raise AssertionError("no GradCache bridge in the loss's graph")


def cached_bytes(shift: float, sparse: bool) -> tuple[int, int]:
    """Bytes of phase (1)'s cached embeddings and of the bridged leaves (whose gradients phase (2) caches), and
    the non-zeros, for one CachedLoss call."""
    torch.manual_seed(0)
    encoder = Splade(shift=shift)
    loss = CachedLoss(encoder, SpladeLoss(document_regularizer_weight=0.3), 4, sparse_cache=sparse)(*batch(16))
    replay = cache_of(loss)
    held = [e for per_input in replay.first.embeddings for e in per_input]
    tensors = [t for e in held for t in ((e.indices, e.values) if isinstance(e, SparseRows) else (e,))]
    nonzeros = sum(int((e.values if isinstance(e, SparseRows) else e).count_nonzero()) for e in held)
    loss.backward()
    return sum(t.numel() * t.element_size() for t in tensors), nonzeros


def test_the_cache_costs_bytes_in_proportion_to_the_non_zeros():
    dense_bytes, _ = cached_bytes(0.0, sparse=False)
    many_bytes, many = cached_bytes(0.0, sparse=True)
    few_bytes, few = cached_bytes(0.9, sparse=True)
    assert 0 < few < many / 4  # the larger shift leaves far fewer non-zeros
    assert many_bytes == 12 * many and few_bytes == 12 * few  # float32 value + two int32 indices per non-zero
    assert few_bytes < dense_bytes / 10
    assert cached_bytes(0.9, sparse=False)[0] == dense_bytes  # the dense cache does not care


def test_the_cached_gradient_is_kept_at_the_non_zeros_only(monkeypatch):
    received = []
    original = GradCache.reencode_and_backward

    def recording(self, replay, cached_gradients):
        received.extend(tuple(g.shape) for g in cached_gradients)
        return original(self, replay, cached_gradients)

    monkeypatch.setattr(GradCache, "reencode_and_backward", recording)
    torch.manual_seed(0)
    encoder = Splade(shift=0.9)
    loss = CachedLoss(encoder, SpladeLoss(document_regularizer_weight=0.3), 4, sparse_cache=True)(*batch(16))
    nonzeros = [(e.values.numel(),) for per_input in cache_of(loss).first.embeddings for e in per_input]
    loss.backward()
    assert received == nonzeros and all(n < 16 * VOCAB / 4 for (n,) in nonzeros)


def test_negative_outputs_are_refused_before_any_gradient():
    torch.manual_seed(0)
    encoder = Splade(shift=0.0, activation=torch.tanh)  # 0 is not where a clamp sends it: negatives appear
    with pytest.raises(ValueError, match="sparse_cache=True is exact only for rows .* negative value"):
        GradCache(encoder, SpladeLoss(document_regularizer_weight=0.3), 4, sparse_cache=True).step(*batch(8))
    assert all(p.grad is None for p in encoder.parameters())


def test_token_embeddings_and_chunk_tokens_are_refused():
    with pytest.raises(ValueError, match="sparse_cache=True is not available with chunk_tokens=20"):
        GradCache(nn.Identity(), SpladeLoss(), 4, sparse_cache=True, chunk_tokens=20)
    with pytest.raises(TypeError, match="sparse_cache must be True or False"):
        GradCache(nn.Identity(), SpladeLoss(), 4, sparse_cache="yes")
    with pytest.raises(TypeError, match=r"caches \(B, V\) rows.*shape \(4, 3, 5\)"):
        GradCache(nn.Identity(), lambda *e: sum(x.sum() for x in e), 4, sparse_cache=True).step(
            torch.rand(8, 3, 5, requires_grad=True))


def test_a_loss_that_takes_sparse_rows_gets_them_and_another_gets_them_dense():
    """`takes_sparse_rows = True` (SpladeLoss's): phase (2) receives the non-zeros as `SparseRows`; any other loss
    (here the same one wrapped in a plain function) receives (B, V) dense rows; both steps equal."""
    torch.manual_seed(0)
    encoder = Splade(shift=0.4).double()
    splade = SpladeLoss(document_regularizer_weight=0.3, query_regularizer_weight=0.4)
    seen: list[type] = []

    class Spy(nn.Module):
        takes_sparse_rows = True

        def forward(self, *columns):
            seen.append(type(columns[0]))
            return splade(*columns)

    def plain(*columns):
        seen.append(type(columns[0]))
        return splade(*columns)

    inputs = batch(7)
    sparse_value, sparse = step(GradCache, encoder, Spy(), inputs, sparse_cache=True)
    dense_value, dense = step(GradCache, encoder, plain, inputs, sparse_cache=True)
    assert seen == [SparseRows, torch.Tensor]
    torch.testing.assert_close(sparse_value, dense_value, rtol=1e-12, atol=0)
    assert_grads_close(sparse, dense, 1e-10)
