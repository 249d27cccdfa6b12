"""GradCache and CachedLoss against one full-batch pass, on every parameter, loss parameters included."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero


def run(strategy_cls, modules, encoders, loss, inputs, chunk_size=None, **options):
    zero(*modules)
    if strategy_cls is CachedLoss:
        value = CachedLoss(encoders, loss, chunk_size, **options)(*inputs)
        value.backward()
        value = value.detach()
    elif strategy_cls is FullBatch:
        value = FullBatch(encoders, loss, **options).step(*inputs)
    else:
        value = strategy_cls(encoders, loss, chunk_size, **options).step(*inputs)
    return value, grads_of(*modules)


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("strategy_cls", [GradCache, CachedLoss])
@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])  # uneven last chunk, one row, larger than the batch
def test_shared_encoder_ntxent_matches_full_batch(strategy_cls, chunk_size, dtype, rel):
    torch.manual_seed(0)
    encoder = mlp().to(dtype).eval()
    loss = NTXent(temperature=0.3)
    view1, view2 = torch.randn(2, 11, 10, dtype=dtype)
    want_loss, want = run(FullBatch, [encoder], encoder, loss, (view1, view2))
    got_loss, got = run(strategy_cls, [encoder], encoder, loss, (view1, view2), chunk_size)
    assert torch.allclose(got_loss, want_loss, rtol=rel, atol=0)
    assert_grads_close(got, want, rel)


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("strategy_cls", [GradCache, CachedLoss])
@pytest.mark.parametrize("chunk_size", [1, (4, 3), 50])
def test_two_towers_dict_input_clip_loss_with_learnable_temperature(strategy_cls, chunk_size, dtype, rel):
    torch.manual_seed(1)
    image, text = mlp().to(dtype).eval(), TokenEncoder().to(dtype).eval()
    loss = ClipLoss(temperature=0.1, learnable=True).to(dtype)
    batch = (torch.randn(13, 10, dtype=dtype), tokens(13))
    want_loss, want = run(FullBatch, [image, text, loss], [image, text], loss, batch)
    got_loss, got = run(strategy_cls, [image, text, loss], [image, text], loss, batch, chunk_size)
    assert want["2.logit_scale"] is not None and want["2.logit_scale"].abs().item() > 0
    assert torch.allclose(got_loss, want_loss, rtol=rel, atol=0)
    assert_grads_close(got, want, rel)


@pytest.mark.parametrize("loss", [InfoNCE(temperature=0.05, symmetric=True), SigLipLoss()], ids=["infonce", "siglip"])
def test_other_losses_match_full_batch(loss):
    torch.manual_seed(2)
    query, passage = mlp().double().eval(), mlp().double().eval()
    loss = loss.double()
    batch = torch.randn(2, 9, 10, dtype=torch.float64)
    want_loss, want = run(FullBatch, [query, passage, loss], [query, passage], loss, tuple(batch))
    got_loss, got = run(GradCache, [query, passage, loss], [query, passage], loss, tuple(batch), 4)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12, atol=0)
    assert_grads_close(got, want, 1e-12)


def test_infonce_with_hard_negatives_chunked_per_input():
    torch.manual_seed(3)
    encoder = mlp().double().eval()
    loss = InfoNCE()
    n, h = 10, 2
    query, positive, negatives = torch.randn(n, 10).double(), torch.randn(n, 10).double(), torch.randn(n * h, 10).double()
    want_loss, want = run(FullBatch, [encoder], encoder, loss, (query, positive, negatives))
    got_loss, got = run(GradCache, [encoder], encoder, loss, (query, positive, negatives), (3, 3, 3 * h))
    assert torch.allclose(got_loss, want_loss, rtol=1e-12, atol=0)
    assert_grads_close(got, want, 1e-12)


def test_user_loss_function_and_loss_kwargs_and_tuple_input():
    """Any callable works as the loss; a tuple chunk reaches the encoder as positional arguments."""

    class TwoArgs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(3, 5)

        def forward(self, x, y):
            return self.a(x) + self.b(y)

    def user_loss(q, p, weight):
        return weight * torch.logsumexp(q @ p.T, dim=1).mean() - (q * p).sum(1).mean()

    torch.manual_seed(4)
    encoder = TwoArgs().double()
    first = (torch.randn(8, 4).double(), torch.randn(8, 3).double())
    second = [torch.randn(8, 4).double(), torch.randn(8, 3).double()]
    zero(encoder)
    want_loss = FullBatch(encoder, user_loss).step(first, second, weight=0.7)
    want = grads_of(encoder)
    zero(encoder)
    got_loss = GradCache(encoder, user_loss, 3).step(first, second, weight=0.7)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-12)


def test_get_embedding_picks_the_tensor_out_of_a_dict_output():
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(10, 6)

        def forward(self, x):
            return {"pooler_output": self.linear(x), "extra": "ignored"}

    torch.manual_seed(5)
    encoder, loss = DictOut().double(), NTXent()
    views = torch.randn(2, 7, 10).double()
    pick = lambda output: output["pooler_output"]  # noqa: E731
    want_loss, want = run(FullBatch, [encoder], encoder, loss, tuple(views), get_embedding=pick)
    got_loss, got = run(GradCache, [encoder], encoder, loss, tuple(views), 2, get_embedding=pick)
    assert_grads_close(got, want, 1e-12)


@pytest.mark.parametrize("strategy_cls", [GradCache, CachedLoss])
def test_get_embedding_per_input_with_none_where_the_output_is_the_embedding(strategy_cls):
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(10, 6)

        def forward(self, x):
            return {"pooler_output": self.linear(x)}

    torch.manual_seed(5)
    towers, loss = [DictOut().double(), mlp(10, 6).double().eval()], ClipLoss(learnable=True).double()
    images, texts = torch.randn(2, 7, 10).double()
    pick = [lambda output: output["pooler_output"], None]
    modules = [*towers, loss]
    want_loss, want = run(FullBatch, modules, towers, loss, (images, texts), get_embedding=pick)
    got_loss, got = run(strategy_cls, modules, towers, loss, (images, texts), 3, get_embedding=pick)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(got, want, 1e-12)


@pytest.mark.parametrize("value, error, fragment", [
    ([None], ValueError, "get_embedding has 1 entries for 2 inputs"),
    ([None, "pooler_output"], TypeError, "get_embedding[1] must be callable or None"),
    ([], ValueError, "get_embedding is an empty sequence"),
])
def test_get_embedding_per_input_refused_naming_the_entry(value, error, fragment):
    towers, loss = [mlp(10, 6), mlp(10, 6)], ClipLoss()
    before = [p.detach().clone() for t in towers for p in t.parameters()]
    with pytest.raises(error, match=re.escape(fragment)):
        GradCache(towers, loss, 3, get_embedding=value).step(*torch.randn(2, 7, 10))
    assert all(p.grad is None for t in towers for p in t.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, (p for t in towers for p in t.parameters())))


def test_large_loss_scale_reaches_cached_gradients_in_float32():
    """(loss * 2**16).backward() multiplies the cached gradient before it meets the encoder."""
    torch.manual_seed(6)
    encoder = mlp().eval()
    loss = NTXent()
    views = tuple(torch.randn(2, 9, 10))
    zero(encoder)
    FullBatch(encoder, loss).step(*views)
    want = {k: v * 2**16 for k, v in grads_of(encoder).items()}
    zero(encoder)
    (CachedLoss(encoder, loss, 4)(*views) * 2**16).backward()
    assert_grads_close(grads_of(encoder), want, 1e-5)


def test_grad_scaler_is_honoured_by_step():
    torch.manual_seed(7)
    encoder = mlp().eval()
    loss = NTXent()
    views = tuple(torch.randn(2, 9, 10))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    zero(encoder)
    FullBatch(encoder, loss).step(*views)
    want = {k: v * 1024.0 for k, v in grads_of(encoder).items()}
    zero(encoder)
    GradCache(encoder, loss, 4, scaler=scaler).step(*views)
    assert_grads_close(grads_of(encoder), want, 1e-5)


def test_gradients_accumulate_like_backward():
    """Two steps without zero_grad add up, as two loss.backward() calls would."""
    torch.manual_seed(8)
    encoder = mlp().double().eval()
    loss = NTXent()
    views = tuple(torch.randn(2, 6, 10).double())
    zero(encoder)
    FullBatch(encoder, loss).step(*views)
    once = grads_of(encoder)
    zero(encoder)
    cache = GradCache(encoder, loss, 4)
    cache.step(*views)
    cache.step(*views)
    assert_grads_close(grads_of(encoder), {k: 2 * v for k, v in once.items()}, 1e-12)


def test_cached_loss_called_twice_before_backward_keeps_each_batch():
    torch.manual_seed(9)
    encoder = mlp().double().eval()
    loss = NTXent()
    first, second = tuple(torch.randn(2, 6, 10).double()), tuple(torch.randn(2, 6, 10).double())
    _, want_first = run(FullBatch, [encoder], encoder, loss, first)
    _, want_second = run(FullBatch, [encoder], encoder, loss, second)
    cached = CachedLoss(encoder, loss, 4)
    zero(encoder)
    loss_first = cached(*first)
    loss_second = cached(*second)
    loss_first.backward()
    assert_grads_close(grads_of(encoder), want_first, 1e-12)
    zero(encoder)
    loss_second.backward()
    assert_grads_close(grads_of(encoder), want_second, 1e-12)


def test_cached_loss_under_no_grad_returns_the_loss_and_does_nothing_else():
    torch.manual_seed(10)
    encoder = mlp().double().eval()
    calls = []
    encoder.register_forward_hook(lambda *args: calls.append(1))
    loss = NTXent()
    views = tuple(torch.randn(2, 7, 10).double())
    with torch.no_grad():
        want = loss(encoder(views[0]), encoder(views[1]))
        calls.clear()
        got = CachedLoss(encoder, loss, 3)(*views)
    assert got.grad_fn is None and not got.requires_grad
    assert torch.allclose(got, want, rtol=1e-12)
    assert len(calls) == 6  # ceil(7 / 3) chunks per view, no second pass
    assert all(p.grad is None for p in encoder.parameters())


def test_memory_only_one_chunk_of_activations_is_alive():
    """Saved activations of the second pass never exceed one chunk: count the rows held by the graph."""
    torch.manual_seed(11)
    encoder = mlp(inp=10, hidden=32).eval()
    loss = NTXent()
    views = tuple(torch.randn(2, 40, 10))
    largest = []

    def pack(tensor):
        if tensor.dim() == 2 and tensor.shape[1] == 32:  # a hidden activation, (rows, 32)
            largest.append(tensor.shape[0])
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        GradCache(encoder, loss, 8).step(*views)
    assert largest and max(largest) == 8
    largest.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        FullBatch(encoder, loss).step(*views)
    assert max(largest) == 40  # the control: the full batch does hold everything


class Tied(nn.Module):
    """A tower holding a layer that another tower holds too (tied weights)."""

    def __init__(self, shared: nn.Linear):
        super().__init__()
        self.shared, self.own = shared, nn.Linear(16, 6)

    def forward(self, x):
        return self.own(torch.tanh(self.shared(x)))


@pytest.mark.parametrize("case", ["shared", "two_towers", "tied"])
def test_each_parameter_accumulates_once_per_step(case):
    """What a DDP wrapper above the encoders needs: one accumulation hook call per parameter per step (the
    last chunk's), however many chunks, and the full-batch gradient in .grad."""
    torch.manual_seed(6)
    if case == "shared":
        encoders = mlp().double()
        modules = [encoders]
    elif case == "two_towers":
        encoders = [mlp().double(), mlp().double()]
        modules = encoders
    else:
        layer = nn.Linear(10, 16).double()
        encoders = [Tied(layer).double(), Tied(layer).double()]
        modules = encoders
    loss = NTXent(temperature=0.2)
    batch = tuple(torch.randn(2, 9, 10, dtype=torch.float64))
    want_loss, want = run(FullBatch, modules, encoders, loss, batch)
    calls: dict[int, int] = {}
    parameters = {id(p): p for m in modules for p in m.parameters()}.values()
    handles = [p.register_post_accumulate_grad_hook(lambda p: calls.__setitem__(id(p), calls.get(id(p), 0) + 1))
               for p in parameters]
    got_loss, got = run(GradCache, modules, encoders, loss, batch, 2)
    for h in handles:
        h.remove()
    unique = {id(p) for m in modules for p in m.parameters()}
    assert calls == {i: 1 for i in unique}
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(got, want, 1e-12)
