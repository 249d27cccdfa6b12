"""A loss with a queue under each strategy: GradCache and CachedLoss equal FullBatch from the same queue state, on
every parameter (the learnable temperature and bias included), and each strategy advances the queue as documented:
once per step by the global batch (GradCache, CachedLoss, FullBatch), once per micro-batch (NaiveAccumulation)."""
from __future__ import annotations

import copy

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss
from gradcache.losses.queue import EmbeddingQueue
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, run_strategy, tokens, zero

N, QUEUE, CHUNK = 8, 11, 3  # the queue holds more than one step's rows of some losses, fewer of others


def setup(name: str, tile_size: int | None):
    """(modules whose gradients are compared, encoders, loss, inputs) in float64, the towers in eval (no dropout)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    options = dict(queue_size=QUEUE, tile_size=tile_size)
    if name == "clip":
        image, text = mlp().double().eval(), TokenEncoder().double().eval()
        loss = ClipLoss(temperature=0.1, learnable=True, **options).double()
        return [image, text, loss], [image, text], loss, (torch.randn(N, 10, generator=g, dtype=torch.float64),
                                                          tokens(N, seed=2))
    encoder = mlp().double().eval()
    loss = {"ntxent": lambda: NTXent(temperature=0.3, **options),
            "infonce": lambda: InfoNCE(temperature=0.1, **options),
            "siglip": lambda: SigLipLoss(temperature=0.1, bias=-3.0, **options).double()}[name]()
    inputs = [torch.randn(N, 10, generator=g, dtype=torch.float64) for _ in range(2)]
    if name == "infonce":  # two hard negatives per query: chunk k of the negatives pairs with chunk k of the queries
        inputs.append(torch.randn(2 * N, 10, generator=g, dtype=torch.float64))
    modules = [encoder, loss] if list(loss.parameters()) else [encoder]
    return modules, encoder, loss, tuple(inputs)


def chunk_sizes(name: str):
    return [CHUNK, CHUNK, 2 * CHUNK] if name == "infonce" else CHUNK


def prime(loss, width: int = 6) -> None:
    """Two calls of the loss on random embeddings: a partly filled or wrapped queue to start from."""
    g = torch.Generator().manual_seed(5)
    for rows in (5, 4):
        count = 3 if isinstance(loss, InfoNCE) else 2
        loss(*[torch.randn(rows * (1 if i < 2 else 2), width, generator=g, dtype=torch.float64) for i in range(count)])


def queues(loss):
    return [m for m in loss.modules() if isinstance(m, EmbeddingQueue)]




def embed(encoders, inputs):
    towers = encoders if isinstance(encoders, list) else [encoders] * len(inputs)
    with torch.no_grad():
        return [t(**x) if isinstance(x, dict) else t(x) for t, x in zip(towers, inputs)]


def pushed(name: str, embeddings):
    """The rows each queue of the loss receives from one call on ``embeddings``."""
    if name == "ntxent":
        return [torch.cat(embeddings)]
    if name == "infonce":
        return [torch.cat(embeddings[1:])]
    return list(embeddings)


@pytest.mark.parametrize("tile_size", [None, 3])
@pytest.mark.parametrize("strategy", [GradCache, CachedLoss])
@pytest.mark.parametrize("name", ["clip", "ntxent", "infonce", "siglip"])
def test_gradcache_with_a_queue_equals_full_batch_from_the_same_queue(name, strategy, tile_size):
    modules, encoders, loss, inputs = setup(name, tile_size)
    prime(loss)
    before = [q.contents(torch.zeros(1, 6, dtype=torch.float64)) for q in queues(loss)]
    want_modules = copy.deepcopy(modules)
    want_encoders = want_modules[: len(encoders)] if isinstance(encoders, list) else want_modules[0]
    want_loss_fn = copy.deepcopy(loss) if loss not in modules else want_modules[-1]
    want_value, want = run_strategy(FullBatch, want_modules, want_encoders, want_loss_fn, inputs, None)
    got_value, got = run_strategy(strategy, modules, encoders, loss, inputs, chunk_sizes(name))
    torch.testing.assert_close(got_value, want_value, rtol=1e-10, atol=0)
    assert_grads_close(got, want, 1e-9)
    if loss in modules:  # the learnable temperature (and bias) got their own, nonzero gradient
        assert all(v.abs().sum() > 0 for k, v in want.items() if k.startswith(f"{len(modules) - 1}."))
    # Once per step: the queue moved by the global batch, in the caller's order.
    for queue, old, new in zip(queues(loss), before, pushed(name, embed(encoders, inputs))):
        torch.testing.assert_close(queue.contents(new), torch.cat([old, new])[-QUEUE:], rtol=1e-12, atol=0)
        assert int(queue.calls) == 3
    for got_queue, want_queue in zip(queues(loss), queues(want_loss_fn)):
        assert torch.equal(got_queue.count, want_queue.count) and torch.equal(got_queue.pointer, want_queue.pointer)


@pytest.mark.parametrize("name", ["clip", "ntxent", "infonce"])
def test_naive_accumulation_advances_the_queue_per_micro_batch(name):
    """Micro-batch k sees the queue that micro-batches 0 .. k - 1 filled: accumulation with a memory bank."""
    modules, encoders, loss, inputs = setup(name, None)
    prime(loss)
    want_modules = copy.deepcopy(modules)
    want_loss_fn = copy.deepcopy(loss) if loss not in modules else want_modules[-1]
    want_encoders = want_modules[: len(encoders)] if isinstance(encoders, list) else want_modules[0]
    got_value, got = run_strategy(NaiveAccumulation, modules, encoders, loss, inputs, chunk_sizes(name))

    zero(*want_modules)  # the reference: the loss called on each micro-batch in turn, each a 1/K share
    sizes = chunk_sizes(name) if isinstance(chunk_sizes(name), list) else [CHUNK] * len(inputs)
    micro = [[_rows(x, k * s, (k + 1) * s) for x, s in zip(inputs, sizes)] for k in range(-(-N // CHUNK))]
    values = []
    towers = want_encoders if isinstance(want_encoders, list) else [want_encoders] * len(inputs)
    for parts in micro:
        value = want_loss_fn(*[t(**p) if isinstance(p, dict) else t(p) for t, p in zip(towers, parts)])
        (value / len(micro)).backward()
        values.append(value.detach())
    torch.testing.assert_close(got_value, torch.stack(values).mean(), rtol=1e-10, atol=0)
    assert_grads_close(got, grads_of(*want_modules), 1e-9)
    for got_queue, want_queue in zip(queues(loss), queues(want_loss_fn)):
        assert int(got_queue.calls) == 2 + len(micro)  # once per micro-batch
        assert torch.equal(got_queue.rows, want_queue.rows) and torch.equal(got_queue.pointer, want_queue.pointer)


def _rows(value, start: int, stop: int):
    return {k: v[start:stop] for k, v in value.items()} if isinstance(value, dict) else value[start:stop]


def test_evaluation_under_no_grad_leaves_the_queue_alone():
    modules, encoders, loss, inputs = setup("clip", None)
    prime(loss)
    before = {k: v.clone() for k, v in loss.named_buffers()}
    with torch.no_grad():
        GradCache(encoders, loss, CHUNK).loss(*inputs)
    assert all(torch.equal(v, before[k]) for k, v in loss.named_buffers())
