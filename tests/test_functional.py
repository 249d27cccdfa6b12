"""The original GradCache's functional form (`cached`, `cat_input_tensor`) and its one-call counterpart
(`GradCache.step(Chunks(sub_batches), ...)`), against one backward over the whole batch encoded sub-batch by
sub-batch with a graph from the same seed (so dropout draws the same masks), float64, dropout on."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcache import CachedLoss, Chunks, FullBatch, GradCache, NaiveAccumulation
from gradcache.functional import cached, cat_input_tensor
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, tokens, zero


class ScaledContrastive(nn.Module):
    """The original README's contrastive loss with a learnable scale; y holds `y.size(0) / x.size(0)` rows per x."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(3.0, dtype=torch.float64))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = torch.arange(0, y.size(0), int(y.size(0) / x.size(0)), device=x.device)
        scores = torch.matmul(x, y.transpose(0, 1)) * self.scale
        return F.cross_entropy(scores, target=target)


def loader(batches: int = 4, rows: int = 3) -> list[tuple[dict, dict]]:
    """Sub-batches (xx, yy) of `rows` queries and 2 * `rows` documents (a positive and a negative each)."""
    return [(tokens(rows, seed=2 * k), tokens(2 * rows, length=7, seed=2 * k + 1)) for k in range(batches)]


def model() -> TokenEncoder:
    torch.manual_seed(0)
    return TokenEncoder().double().train()  # dropout 0.2 on


def reference(encoder: nn.Module, loss_fn: nn.Module, sub_batches, seed: int = 7) -> tuple[torch.Tensor, dict]:
    """One backward over the whole batch: each sub-batch encoded with a graph in the loop's order (x, then y)."""
    zero(encoder, loss_fn)
    torch.manual_seed(seed)
    xs, ys = [], []
    for xx, yy in sub_batches:
        xs.append(encoder(**xx))
        ys.append(encoder(**yy))
    value = loss_fn(torch.cat(xs), torch.cat(ys))
    value.backward()
    return value.detach(), grads_of(encoder, loss_fn)


def test_the_original_readme_loop_gives_the_full_batch_gradient():
    encoder, loss_fn, sub_batches = model(), ScaledContrastive(), loader()
    want_loss, want = reference(encoder, loss_fn, sub_batches)

    @cached
    def call_model(model, input):
        return model(**input)

    @cat_input_tensor
    def contrastive_loss(x, y):
        return loss_fn(x, y)

    zero(encoder, loss_fn)
    torch.manual_seed(7)
    cache_x, cache_y, closures_x, closures_y = [], [], [], []
    for xx, yy in sub_batches:  # the README's loop, verbatim but for the names
        rx, cx = call_model(encoder, xx)
        ry, cy = call_model(encoder, yy)
        cache_x.append(rx)
        cache_y.append(ry)
        closures_x.append(cx)
        closures_y.append(cy)
    loss = contrastive_loss(cache_x, cache_y)
    loss.backward()
    for f, r in zip(closures_x, cache_x):
        f(r)
    for f, r in zip(closures_y, cache_y):
        f(r)

    assert torch.allclose(loss.detach(), want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder, loss_fn), want, 1e-10)


def test_dropout_is_replayed_so_fresh_masks_would_differ():
    """The control: the reference with other masks has another gradient, so the equality above can fail."""
    encoder, loss_fn, sub_batches = model(), ScaledContrastive(), loader()
    _, first = reference(encoder, loss_fn, sub_batches, seed=7)
    _, second = reference(encoder, loss_fn, sub_batches, seed=8)
    assert any((first[k] - second[k]).abs().max() > 1e-6 for k in first)


@pytest.mark.parametrize("door", ["step", "cached_loss"])
def test_ready_made_chunks_give_the_full_batch_gradient(door):
    encoder, loss_fn, sub_batches = model(), ScaledContrastive(), loader()
    zero(encoder, loss_fn)
    torch.manual_seed(7)  # GradCache encodes input by input: every x, then every y
    xs = [encoder(**xx) for xx, _ in sub_batches]
    ys = [encoder(**yy) for _, yy in sub_batches]
    want_loss = loss_fn(torch.cat(xs), torch.cat(ys))
    want_loss.backward()
    want = grads_of(encoder, loss_fn)

    zero(encoder, loss_fn)
    torch.manual_seed(7)
    inputs = Chunks([xx for xx, _ in sub_batches]), Chunks([yy for _, yy in sub_batches])
    if door == "step":
        got_loss = GradCache(encoder, loss_fn, chunk_size=1000).step(*inputs)
    else:
        got_loss = CachedLoss(encoder, loss_fn, chunk_size=1000)(*inputs)
        got_loss.backward()
    assert torch.allclose(got_loss.detach(), want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder, loss_fn), want, 1e-10)


def test_chunks_are_trimmed_and_every_strategy_takes_them():
    encoder, loss_fn, sub_batches = model(), ScaledContrastive(), loader()
    encoder.eval()  # FullBatch encodes in one order, GradCache in another: no dropout to compare them
    inputs = Chunks([xx for xx, _ in sub_batches]), Chunks([yy for _, yy in sub_batches])
    results = {}
    for strategy in (FullBatch, GradCache):
        zero(encoder, loss_fn)
        encoder.seen_lengths.clear()
        results[strategy] = strategy(encoder, loss_fn, 1000, trim_padding=True).step(*inputs), grads_of(encoder, loss_fn)
        widest = max(int(c["attention_mask"].sum(1).max()) for c in inputs[0])
        assert max(encoder.seen_lengths) <= max(widest, 7)
    assert torch.allclose(results[FullBatch][0], results[GradCache][0], rtol=1e-12)
    assert_grads_close(results[GradCache][1], results[FullBatch][1], 1e-10)
    # NaiveAccumulation pairs sub-batch k of every input: the loss of each sub-batch alone
    zero(encoder, loss_fn)
    NaiveAccumulation(encoder, loss_fn, 1000).step(*inputs)
    assert not torch.allclose(encoder.proj.weight.grad, results[GradCache][1]["0.proj.weight"])


def test_several_reps_and_a_closure_given_them_as_a_tuple():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.3)).double().train()
    x = torch.randn(6, 5, dtype=torch.float64)

    def both(model, batch):
        out = model(batch)
        return out[:, :4], out[:, 4:]

    zero(encoder)
    torch.manual_seed(3)
    heads = [both(encoder, b) for b in x.split(2)]
    want_loss = (torch.cat([h[0] for h in heads]) @ torch.cat([h[1] for h in heads]).T).logsumexp(1).mean()
    want_loss.backward()
    want = grads_of(encoder)

    call = cached(both)
    zero(encoder)
    torch.manual_seed(3)
    results = [call(encoder, b) for b in x.split(2)]
    loss = cat_input_tensor(lambda a, b: (a @ b.T).logsumexp(1).mean())(
        [r[0] for r in results], b=[r[1] for r in results])  # keyword lists are concatenated too
    loss.backward()
    for a, b, closure in results:
        closure((a, b))
    assert torch.allclose(loss.detach(), want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-10)


def test_the_closure_refuses_what_would_write_a_wrong_gradient():
    encoder = nn.Linear(4, 3).double()
    call = cached(lambda model, batch: model(batch))
    rep, closure = call(encoder, torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="no .grad: call loss.backward"):
        closure(rep)
    rep.sum().backward()
    with pytest.raises(ValueError, match="takes the 1 rep"):
        closure(rep.detach().requires_grad_())
    assert encoder.weight.grad is None  # nothing written so far
    closure(rep)
    assert encoder.weight.grad is not None
    with pytest.raises(RuntimeError, match="already ran"):
        closure(rep)
    with pytest.raises(TypeError, match="must return the reps"):
        cached(lambda model, batch: {"pooler_output": model(batch)})(encoder, torch.randn(2, 4, dtype=torch.float64))


def test_the_closure_notices_a_model_changed_between_the_passes():
    from gradcache import RecomputationMismatchError

    encoder = nn.Linear(4, 3).double()
    rep, closure = cached(lambda model, batch: model(batch))(encoder, torch.randn(2, 4, dtype=torch.float64))
    rep.sum().backward()
    with torch.no_grad():
        encoder.weight.add_(1.0)
    with pytest.raises(RecomputationMismatchError):
        closure(rep)
    assert encoder.weight.grad is None


def test_chunks_refuse_bad_input_before_anything_runs():
    with pytest.raises(ValueError, match="at least one chunk"):
        Chunks([])
    with pytest.raises(TypeError, match="a list or tuple of chunks"):
        Chunks(torch.randn(4, 2))
    encoder = nn.Linear(2, 2).double()
    cache = GradCache(encoder, lambda a: a.sum(), 2, split_fn=lambda v, n: list(v))
    with pytest.raises(ValueError, match="Chunks and split_fn"):
        cache.step(Chunks([torch.randn(2, 2, dtype=torch.float64)]))
    with pytest.raises(ValueError, match="chunk 2 of input 0 is an empty batch"):
        GradCache(encoder, lambda a: a.sum(), 2).step(Chunks([torch.randn(2, 2), torch.randn(0, 2)]))
    assert encoder.weight.grad is None
