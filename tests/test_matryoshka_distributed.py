"""Matryoshka with a queue on two gloo ranks: under GradCache, CachedLoss, FullBatch and NaiveAccumulation, dense and
tiled, every rank keeps the same full-width queue and the second step's gradients (read against the first step's
queue) equal one process on the concatenated batches."""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss, InfoNCE, Matryoshka, NTXent
from tests.conftest import TokenEncoder, assert_grads_close, mlp, tokens
from tests.multiprocess import run_on_ranks
from tests.test_distributed import grads, rows

GLOBAL, QUEUE, CHUNK, STEPS, DIMS, WEIGHTS = 8, 10, 2, 2, (6, 3, 1), (1.0, 0.5, 2.0)
CASES = {  # case: (strategy, inner loss, tile_size)
    "gradcache_clip": (GradCache, "clip", None),
    "cached_clip_tiled": (CachedLoss, "clip", 3),
    "full_infonce": (FullBatch, "infonce", None),
    "naive_ntxent_tiled": (NaiveAccumulation, "ntxent", 3),
}


def models(name: str, tile_size: int | None):
    torch.manual_seed(0)
    options = dict(queue_size=QUEUE, tile_size=tile_size)
    if name == "clip":
        inner = ClipLoss(temperature=0.1, learnable=True, **options)
        return [mlp(), TokenEncoder().eval()], Matryoshka(inner, DIMS, weights=WEIGHTS)
    inner = NTXent(temperature=0.3, **options) if name == "ntxent" else InfoNCE(temperature=0.1, **options)
    return [mlp()], Matryoshka(inner, DIMS, weights=WEIGHTS)


def batches(name: str):
    g = torch.Generator().manual_seed(1)
    if name == "clip":
        return [(torch.randn(GLOBAL, 10, generator=g), tokens(GLOBAL, seed=step)) for step in range(STEPS)]
    return [(torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 10, generator=g)) for _ in range(STEPS)]


def steps(strategy, towers, loss, step_batches, chunk_size=CHUNK):
    """STEPS steps of ``strategy``; the loss's buffers after them (the gradients are those of the last)."""
    encoders = towers if len(towers) > 1 else towers[0]
    for batch in step_batches:
        for module in [*towers, loss]:
            module.zero_grad(set_to_none=True)
        if strategy is CachedLoss:
            CachedLoss(encoders, loss, chunk_size)(*batch).backward()
        elif strategy is FullBatch:
            FullBatch(encoders, loss).step(*batch)
        else:
            strategy(encoders, loss, chunk_size).step(*batch)
    return dict(loss.named_buffers())


def worker(rank, world_size):
    """Every case in one pair of processes: starting ranks costs more than running the cases."""
    half = slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)
    results = {}
    for case, (strategy, name, tile_size) in CASES.items():
        towers, loss = models(name, tile_size)
        wrapped = [DistributedDataParallel(t) for t in towers]
        buffers = steps(strategy, wrapped, loss, [[rows(b, half) for b in batch] for batch in batches(name)])
        results[case] = {"buffers": buffers, "grads": grads(*towers, loss)}
    return results


def reference(strategy, name, tile_size):
    """One process: FullBatch on the global batch, or NaiveAccumulation on the gathered micro-batches (micro-batch
    k is chunk k of rank 0 then of rank 1: one process with chunk 2 * CHUNK over the rows in that order)."""
    towers, loss = models(name, tile_size)
    if strategy is not NaiveAccumulation:
        return steps(FullBatch, towers, loss, batches(name)), grads(*towers, loss)
    half = GLOBAL // 2
    order = torch.cat([torch.cat([torch.arange(s, s + CHUNK), torch.arange(half + s, half + s + CHUNK)])
                       for s in range(0, half, CHUNK)])
    buffers = steps(strategy, towers, loss, [[rows(b, order) for b in batch] for batch in batches(name)], 2 * CHUNK)
    return buffers, grads(*towers, loss)


def test_two_ranks_keep_one_full_width_queue_and_exact_gradients():
    ranks = run_on_ranks(worker, 2)
    for case, (strategy, name, tile_size) in CASES.items():
        want_buffers, want = reference(strategy, name, tile_size)
        assert all(b.shape == (QUEUE, DIMS[0]) for k, b in want_buffers.items() if k.endswith("rows"))
        for result in ranks:
            assert result[case]["buffers"].keys() == want_buffers.keys()
            for key, value in want_buffers.items():
                torch.testing.assert_close(result[case]["buffers"][key], value, rtol=1e-5, atol=1e-6)
            assert_grads_close(result[case]["grads"], want, 1e-5)
        assert all(torch.equal(ranks[0][case]["buffers"][k], ranks[1][case]["buffers"][k]) for k in want_buffers)
