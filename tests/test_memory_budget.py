"""memory_budget: kept graphs in phase (1), re-encoding only the rest, against FullBatch on every parameter."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import gradcache.batchnorm
from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.graph_memory import saved_bytes
from gradcache.losses import ClipLoss, NTXent
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero


class Counting(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def graph_bytes(encoder, chunk):
    """One chunk's graph as the budget counts it, measured here the same documented way."""
    with torch.enable_grad(), saved_bytes([*encoder.parameters(), *encoder.buffers(), chunk]) as graph:
        encoder(chunk)
    return graph.total


def budgets(one_chunk):
    """None, none kept, one chunk, part of the batch (two chunks and a half), all of it: kept chunks per input."""
    return {"none": None, "zero": 0, "one": one_chunk, "part": int(2.5 * one_chunk), "all": 10**12}


def test_graph_bytes_count_each_storage_once_and_leave_out_parameters():
    linear = nn.Linear(8, 8, bias=False).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    with torch.enable_grad(), saved_bytes([*linear.parameters(), x]) as graph:
        y = linear(x)
        z = (y * y) * y  # saves y (once, though used three times) and y*y
    assert graph.total == 2 * 5 * 8 * 8  # two (5, 8) float64 storages; not x, not the weight
    assert z.requires_grad


def test_a_measured_graph_that_is_dropped_is_freed():
    """An output its own node saves (tanh's) must not end up holding that node: a cycle through C++ that no
    garbage collector breaks, so every chunk measured and found over the budget would leak its graph."""
    x = torch.randn(4, 3, requires_grad=True)
    with torch.enable_grad(), saved_bytes([x]) as graph:
        y = torch.tanh(2 * x)
    alive = weakref.ref(y)
    del y
    gc.collect()
    assert graph.total > 0 and alive() is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero", "part"])
def test_steps_whose_budget_drops_a_measured_graph_hold_no_more_tensors_than_before(name):
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 6)).double()  # tanh saves its output
    loss = NTXent(temperature=0.3)
    views = tuple(torch.randn(2, 11, 10, dtype=torch.float64))
    strategy = GradCache(encoder, loss, 3, memory_budget=budgets(graph_bytes(encoder, views[0][:3]))[name])

    def live_tensors_after_a_step() -> int:
        strategy.step(*views)
        zero(encoder)
        gc.collect()
        return sum(type(o) in (torch.Tensor, nn.Parameter) for o in gc.get_objects())

    first = live_tensors_after_a_step()
    assert [live_tensors_after_a_step() for _ in range(3)] == [first] * 3


@pytest.mark.parametrize("strategy", ["gradcache", "cached_scaled"])
@pytest.mark.parametrize("name", ["none", "zero", "one", "part", "all"])
def test_shared_encoder_every_budget_matches_full_batch(name, strategy):
    torch.manual_seed(0)
    encoder = Counting(mlp().double().eval())
    loss = NTXent(temperature=0.3)
    views = tuple(torch.randn(2, 11, 10, dtype=torch.float64))  # chunks of 3: 3, 3, 3, 2 per view
    FullBatch(encoder, loss).step(*views)
    want = grads_of(encoder)
    budget = budgets(graph_bytes(encoder.inner, views[0][:3]))[name]
    zero(encoder)
    encoder.calls = 0
    if strategy == "gradcache":
        GradCache(encoder, loss, 3, memory_budget=budget).step(*views)
        scale = 1.0
    else:  # the caller's GradScaler on CachedLoss's loss reaches kept and re-encoded chunks alike
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        scaler.scale(CachedLoss(encoder, loss, 3, memory_budget=budget)(*views)).backward()
        scale = 256.0
    kept_per_view = {"none": 0, "zero": 0, "one": 1, "part": 2, "all": 4}[name]
    if name == "one":  # the first view's first chunk fills the budget; the second view keeps none
        kept = 1
    elif name == "part":
        kept = 2
    else:
        kept = 2 * kept_per_view
    assert encoder.calls == 8 + (8 - kept)  # phase (1) once per chunk, phase (3) for the chunks not kept
    assert_grads_close({k: v / scale for k, v in grads_of(encoder).items()}, want, 1e-12)


@pytest.mark.parametrize("name", ["none", "zero", "one", "part", "all"])
def test_two_towers_dict_inputs_every_budget_matches_full_batch(name):
    torch.manual_seed(1)
    image, text = mlp().double().eval(), TokenEncoder().double().eval()
    loss = ClipLoss(temperature=0.1, learnable=True).double()
    batch = (torch.randn(13, 10, dtype=torch.float64), tokens(13))
    FullBatch([image, text], loss).step(*batch)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    budget = budgets(graph_bytes(image, batch[0][:4]))[name]
    GradCache([image, text], loss, 4, memory_budget=budget).step(*batch)  # 4, 4, 4, 1
    assert_grads_close(grads_of(image, text, loss), want, 1e-12)


def test_with_dropout_every_budget_gives_the_gradient_of_no_budget():
    """The kept chunks use the dropout masks they drew; the re-encoded ones replay theirs."""
    results = {}
    for name in ("none", "zero", "one", "part", "all"):
        torch.manual_seed(2)
        encoder = mlp(dropout=0.3).double()
        views = tuple(torch.randn(2, 10, 10, dtype=torch.float64))
        budget = budgets(graph_bytes(encoder, views[0][:3]))[name]
        torch.manual_seed(3)
        value = GradCache(encoder, NTXent(), 3, memory_budget=budget).step(*views)
        results[name] = (value, grads_of(encoder))
    for name, (value, got) in results.items():
        assert torch.allclose(value, results["none"][0], rtol=1e-12), name
        assert_grads_close(got, results["none"][1], 1e-12)


def test_batchnorm_buffers_leave_as_one_chunked_forward_left_them(monkeypatch):
    def run(budget):
        monkeypatch.setattr(gradcache.batchnorm, "_warned", False)  # warned once per process
        torch.manual_seed(4)
        encoder = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Linear(16, 6)).double()
        views = tuple(torch.randn(2, 9, 10, dtype=torch.float64))
        with pytest.warns(UserWarning, match="BatchNorm"):
            GradCache(encoder, NTXent(), 3, memory_budget=budget).step(*views)
        return [b.clone() for b in encoder[1].buffers()], grads_of(encoder)

    want_buffers, want = run(None)
    for budget in (0, 10**12):
        got_buffers, got = run(budget)
        for a, b in zip(got_buffers, want_buffers):
            assert torch.equal(a, b)
        assert int(want_buffers[2]) == 6  # num_batches_tracked: one per chunk, as one chunked forward
        assert_grads_close(got, want, 1e-12)


@pytest.mark.parametrize("budget", [None, 2000, 10**12])
def test_bf16_autocast_every_budget_matches_full_batch(budget):
    """Kept chunks ran under phase (1)'s autocast, re-encoded ones under the recorded one: bf16 everywhere."""
    torch.manual_seed(5)
    image, text = mlp(), TokenEncoder().eval()
    loss = ClipLoss(temperature=0.1, learnable=True)
    batch = (torch.randn(9, 10), tokens(9, seed=6))
    FullBatch([image, text], loss, autocast_dtype=torch.bfloat16).step(*batch)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    dtypes = []
    handle = image.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    GradCache([image, text], loss, 4, autocast_dtype=torch.bfloat16, memory_budget=budget).step(*batch)
    handle.remove()
    assert set(dtypes) == {torch.bfloat16}
    assert_grads_close(grads_of(image, text, loss), want, 5e-2)


def _kept_chunks(encoder: Counting, views, chunk: int, budget: int, dtype: torch.dtype | None) -> int:
    """Chunks phase (1) kept: those phase (3) did not encode again."""
    encoder.calls = 0
    GradCache(encoder, NTXent(temperature=0.3), chunk, memory_budget=budget, autocast_dtype=dtype).step(*views)
    chunks = sum(-(-len(v) // chunk) for v in views)
    return 2 * chunks - encoder.calls


def test_autocasts_copy_of_a_weight_serves_every_kept_chunk_and_the_decision_keeps_to_the_dtype():
    """Wide layers over few rows: autocast's bf16 copy of each weight (one for every chunk of the step, its weight
    cache) is far larger than a chunk's activations. A budget that holds every chunk's float32 graph must hold
    every chunk's bf16 one (issue 39 item 6: the copy was counted once per chunk, so it kept none)."""
    torch.manual_seed(2)
    encoder = Counting(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                                     nn.Linear(256, 16)))
    views = tuple(torch.randn(2, 8, 64))
    every_fp32_graph = sum(graph_bytes(encoder.inner, c) for v in views for c in v.split(2))
    assert _kept_chunks(encoder, views, 2, every_fp32_graph, None) == 8
    assert _kept_chunks(encoder, views, 2, every_fp32_graph, torch.bfloat16) == 8
    weights_in_bf16 = sum(p.numel() * 2 for p in encoder.parameters() if p.dim() == 2)
    assert weights_in_bf16 > every_fp32_graph  # counted even once, the copy alone would keep no chunk


def test_a_storage_a_kept_graph_holds_is_counted_once():
    """A tensor every chunk's graph saves (a table the encoder builds once and reuses) is paid by the first kept
    chunk alone: the ledger's second chunk counts only its own."""
    table = torch.randn(64, 64).tanh()  # not a parameter: saved by every chunk's matmul

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(64, 64)

        def forward(self, x):
            return self.linear(x) @ table

    from gradcache.graph_memory import GraphBudget

    encoder, chunks = Shared(), torch.randn(2, 3, 64)
    budget = GraphBudget(10**9)
    sizes = []
    for chunk in chunks:
        with torch.enable_grad(), saved_bytes([*encoder.parameters(), chunk], budget.held) as graph:
            encoder(chunk)
        assert budget.settle(0, chunk, graph)
        sizes.append(graph.total)
    assert sizes[0] - sizes[1] == table.numel() * 4
