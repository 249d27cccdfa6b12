"""Two gloo ranks with a queue: every rank enqueues the same gathered global batch, so the queues agree, and the
second step's gradients (read against the first step's queue) equal one process on the concatenated batches."""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from gradcache import FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss, NTXent
from tests.conftest import TokenEncoder, assert_grads_close, mlp, tokens
from tests.multiprocess import run_on_ranks
from tests.test_distributed import WholeModel, grads, rows

GLOBAL, QUEUE, CHUNK, STEPS = 8, 10, 2, 2


def models(name: str):
    torch.manual_seed(0)
    if name == "ntxent":
        return [mlp()], NTXent(temperature=0.3, queue_size=QUEUE)
    return [mlp(), TokenEncoder().eval()], ClipLoss(temperature=0.1, learnable=True, queue_size=QUEUE)


def batches(name: str):
    g = torch.Generator().manual_seed(1)
    if name == "ntxent":
        return [(torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 10, generator=g)) for _ in range(STEPS)]
    return [(torch.randn(GLOBAL, 10, generator=g), tokens(GLOBAL, seed=step)) for step in range(STEPS)]


def steps(strategy, towers, loss, step_batches, select=lambda b: b, chunk_size=CHUNK):
    """STEPS steps of ``strategy``; the gradients of the last (zeroed before each), and the loss's buffers."""
    encoders = towers if len(towers) > 1 else towers[0]
    for batch in step_batches:
        for module in [*towers, loss]:
            module.zero_grad(set_to_none=True)
        strategy(encoders, loss, chunk_size).step(*select(batch))
    return dict(loss.named_buffers())


def worker(rank, world_size):
    half = slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)
    local = lambda batch: [rows(b, half) for b in batch]  # noqa: E731
    results = {}
    for case, strategy, name in (("gradcache_clip", GradCache, "clip"), ("naive_ntxent", NaiveAccumulation, "ntxent")):
        towers, loss = models(name)
        wrapped = [DistributedDataParallel(t) for t in towers]
        buffers = steps(strategy, wrapped, loss, batches(name), local)
        results[case] = {"buffers": buffers, "grads": grads(*towers, loss)}
    # The loss inside a DDP-wrapped module (broadcast_buffers=True, the default): rank 0's queue is broadcast on
    # every forward; it equals every rank's, so nothing changes but the traffic.
    towers, loss = models("clip")
    model = DistributedDataParallel(WholeModel(towers, loss, CHUNK, {}))
    for batch in batches("clip"):
        model.zero_grad(set_to_none=True)
        model(*local(batch)).backward()
    results["whole_model"] = {"buffers": dict(loss.named_buffers()), "grads": grads(*towers, loss)}
    return results


def reference(strategy, name):
    """One process: FullBatch on the global batch, or for NaiveAccumulation the gathered micro-batches."""
    towers, loss = models(name)
    if strategy is NaiveAccumulation:
        buffers = steps(strategy, towers, loss, batches(name), _global_micro_batches, chunk_size=2 * CHUNK)
    else:
        buffers = steps(strategy, towers, loss, batches(name))
    return buffers, grads(*towers, loss)


def _global_micro_batches(batch):
    """One process's order for rank-major micro-batches: micro-batch k is chunk k of rank 0 then of rank 1, so
    one process with chunk 2 * CHUNK over the rows re-ordered that way sees the same micro-batches."""
    half = GLOBAL // 2
    order = torch.cat([torch.cat([torch.arange(s, s + CHUNK), torch.arange(half + s, half + s + CHUNK)])
                       for s in range(0, half, CHUNK)])
    return [b[order] for b in batch]


def test_two_ranks_keep_identical_queues_and_exact_gradients():
    ranks = run_on_ranks(worker, 2)
    for case, strategy, name in (("gradcache_clip", FullBatch, "clip"), ("naive_ntxent", NaiveAccumulation, "ntxent"),
                                 ("whole_model", FullBatch, "clip")):
        want_buffers, want = reference(strategy, name)
        for result in ranks:
            assert result[case]["buffers"].keys() == want_buffers.keys()
            for key, value in want_buffers.items():
                torch.testing.assert_close(result[case]["buffers"][key], value, rtol=1e-5, atol=1e-6)
            assert_grads_close(result[case]["grads"], want, 1e-5)
        assert all(torch.equal(ranks[0][case]["buffers"][k], ranks[1][case]["buffers"][k]) for k in want_buffers)
