"""Two gloo ranks on CPU: every strategy under DDP against one process on the concatenated global batch."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.distributed import all_gather_with_grad
from gradcache.losses import ClipLoss, NTXent
from tests.conftest import TokenEncoder, assert_grads_close, mlp, tokens
from tests.multiprocess import run_on_ranks

GLOBAL = 12  # global batch; rank r holds rows SLICES[r] (uneven case: 7 and 5)
STRATEGIES = {"gradcache": GradCache, "cached": CachedLoss, "full": FullBatch, "naive": NaiveAccumulation}


def two_tower_model():
    torch.manual_seed(0)
    return mlp(), TokenEncoder().eval(), ClipLoss(temperature=0.1, learnable=True)  # eval: no dropout


def shared_model():
    torch.manual_seed(1)
    return mlp(), NTXent(temperature=0.2)


def two_tower_batch(seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(GLOBAL, 10, generator=g), tokens(GLOBAL, seed=seed + 1)


def shared_batch():
    g = torch.Generator().manual_seed(4)
    return torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 10, generator=g)


def rows(value, sl):
    return {k: v[sl] for k, v in value.items()} if isinstance(value, dict) else value[sl]


def grads(*modules):
    return {f"{i}.{n}": p.grad.clone() for i, m in enumerate(modules) for n, p in m.named_parameters()}


def one_step(name, encoders, loss, inputs, chunk_size):
    if name in VARIANTS:
        return GradCache(encoders, loss, chunk_size, **VARIANTS[name]).step(*inputs)
    strategy = STRATEGIES[name](encoders, loss, chunk_size) if name != "full" else FullBatch(encoders, loss)
    if name == "cached":
        value = strategy(*inputs)
        value.backward()
        return value.detach()
    return strategy.step(*inputs)


# GradCache options under DDP, each against FullBatch: part of the batch kept (about one chunk of each tower), all
# of it, and the text tower chunked by tokens (two-tower inputs only)
VARIANTS = {"budget_part": {"memory_budget": 1500}, "budget_all": {"memory_budget": 10**12},
            "tokens": {"chunk_tokens": [None, 20], "memory_budget": 3000}}


def variant_names(model_name):
    return [v for v in VARIANTS if model_name == "two_tower" or v != "tokens"]


def ddp_worker(rank, world_size, model_name, slices, chunk_size):
    """On each rank: wrap the towers in DDP, count all-reduce calls, run each strategy on the local slice."""
    results = {}
    for name in [*STRATEGIES, *variant_names(model_name)]:
        if model_name == "two_tower":
            image, text, loss = two_tower_model()
            towers, batch = [image, text], two_tower_batch()
        else:
            encoder, loss = shared_model()
            towers, batch = [encoder], shared_batch()
        calls = []

        def counting_hook(state, bucket):
            calls.append(1)
            return allreduce_hook(state, bucket)

        wrapped = [DistributedDataParallel(t) for t in towers]
        for w in wrapped:
            w.register_comm_hook(dist.group.WORLD, counting_hook)
        local = [rows(b, slices[rank]) for b in batch]
        encoders = wrapped if model_name == "two_tower" else wrapped[0]
        value = one_step(name, encoders, loss, local, chunk_size)
        results[name] = {"loss": value, "grads": grads(*towers, loss), "allreduce_calls": len(calls)}
    return results


def reference(model_name, name, chunk_size, batch_seed=2):
    """One process, the concatenated global batch: FullBatch, or for NaiveAccumulation the mean over global
    micro-batches k, each made of chunk k of every rank."""
    if model_name == "two_tower":
        image, text, loss = two_tower_model()
        modules, encoders, batch = [image, text, loss], [image, text], two_tower_batch(batch_seed)
    else:
        encoder, loss = shared_model()
        modules, encoders, batch = [encoder, loss], encoder, shared_batch()
    if name != "naive":
        value = FullBatch(encoders, loss).step(*batch)
        return value, grads(*modules)
    half = GLOBAL // 2
    micro = []
    for start in range(0, half, chunk_size):
        idx = torch.cat([torch.arange(start, min(start + chunk_size, half)),
                         torch.arange(half + start, half + min(start + chunk_size, half))])
        micro.append([rows(b, idx) for b in batch])
    values = []
    for parts in micro:
        embeddings = [(encoders[i] if isinstance(encoders, list) else encoders)(**p) if isinstance(p, dict)
                      else (encoders[i] if isinstance(encoders, list) else encoders)(p) for i, p in enumerate(parts)]
        value = loss(*embeddings)
        (value / len(micro)).backward()
        values.append(value.detach())
    return torch.stack(values).mean(), grads(*modules)


def all_cases_worker(rank, world_size):
    """Every scenario in one pair of processes: starting ranks costs more than running the cases."""
    half = slice(0, GLOBAL // 2), slice(GLOBAL // 2, GLOBAL)
    return {
        "two_tower": ddp_worker(rank, world_size, "two_tower", half, 4),
        "shared": ddp_worker(rank, world_size, "shared", half, 4),
        "uneven": uneven_worker(rank, world_size, (slice(0, 7), slice(7, GLOBAL))),
        "gather": gather_worker(rank, world_size),
        "held_no_sync": held_no_sync_worker(rank, world_size, half),
        "two_embeddings": two_embeddings_worker(rank, world_size, half),
        "wrapped": {(m, v): wrapped_worker(rank, world_size, m, half, VARIANTS.get(v, {}))
                    for m in ("two_tower", "shared") for v in ["plain", *variant_names(m)]},
    }


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(all_cases_worker, 2)


@pytest.fixture(scope="module")
def even_runs(ranks):
    return {m: [r[m] for r in ranks] for m in ("two_tower", "shared")}


@pytest.mark.parametrize("model_name, name", [(m, n) for m in ("two_tower", "shared")
                                              for n in [*STRATEGIES, *variant_names(m)]])
def test_ddp_gradients_equal_single_process_on_the_global_batch(even_runs, model_name, name):
    want_loss, want = reference(model_name, "full" if name in VARIANTS else name, 4)
    for rank_result in even_runs[model_name]:
        got = rank_result[name]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5), (name, got["loss"], want_loss)
        assert_grads_close(got["grads"], want, 1e-5)
        if model_name == "two_tower":  # the learnable temperature: exactly its own gradient, not world_size times it
            assert torch.allclose(got["grads"]["2.logit_scale"], want["2.logit_scale"], rtol=1e-4)


@pytest.mark.parametrize("model_name", ["two_tower", "shared"])
def test_one_gradient_synchronisation_per_step(even_runs, model_name):
    """GradCache's second pass runs every chunk but the last under no_sync: as many all-reduce calls as one
    ordinary DDP step (FullBatch), while NaiveAccumulation also syncs once (on its last micro-batch)."""
    runs = even_runs[model_name][0]
    one_ddp_step = runs["full"]["allreduce_calls"]
    assert one_ddp_step >= 1
    for name in ("gradcache", "cached", "naive", *variant_names(model_name)):
        assert runs[name]["allreduce_calls"] == one_ddp_step, name


def test_uneven_ranks_are_exact_for_gradcache(ranks):
    """The last batch of an epoch: 7 rows on rank 0 and 5 on rank 1 still give the global-batch gradient."""
    results = [r["uneven"] for r in ranks]
    want_loss, want = reference("two_tower", "full", 4)
    for rank_result in results:
        assert torch.allclose(rank_result["loss"], want_loss, rtol=1e-5)
        assert_grads_close(rank_result["grads"], want, 1e-5)
    assert "different numbers of micro-batches" in results[0]["naive_error"]


def uneven_worker(rank, world_size, slices):
    image, text, loss = two_tower_model()
    towers = [DistributedDataParallel(image), DistributedDataParallel(text)]
    local = [rows(b, slices[rank]) for b in two_tower_batch()]
    value = GradCache(towers, loss, 3).step(*local)
    result = {"loss": value, "grads": grads(image, text, loss)}
    try:  # 7 rows make 3 micro-batches of 3 on rank 0, 5 make 2 on rank 1
        NaiveAccumulation(towers, loss, 3).step(*local)
    except ValueError as error:
        result["naive_error"] = str(error)
    return result


class TwoEmbeddings(nn.Module):
    """A text tower returning a tuple: a pooled embedding (B, 6) and two half-width rows per example (2B, 3)."""

    def __init__(self):
        super().__init__()
        self.text = TokenEncoder()

    def forward(self, input_ids, attention_mask):
        pooled = self.text(input_ids, attention_mask)
        return pooled, torch.tanh(pooled).reshape(-1, 3)


def two_embeddings_setup():
    image, _, clip = two_tower_model()
    torch.manual_seed(6)
    text = TwoEmbeddings().eval()

    def loss(image_embedding, pooled, halves):  # (N, 6), (N, 6), (2N, 3): each gathered over ranks on its own
        return clip(image_embedding, pooled) + 0.5 * clip(image_embedding[:, :3].repeat_interleave(2, 0), halves)

    return image, text, clip, loss


def two_embeddings_worker(rank, world_size, slices):
    """An encoder returning several embeddings, one loss argument each, under DDP: each gathered by its own rows."""
    results = {}
    for name in ("gradcache", "cached"):
        image, text, clip, loss = two_embeddings_setup()
        towers = [DistributedDataParallel(image), DistributedDataParallel(text)]
        value = one_step(name, towers, loss, [rows(b, slices[rank]) for b in two_tower_batch()], 4)
        results[name] = {"loss": value, "grads": grads(image, text, clip)}
    return results


@pytest.mark.parametrize("name", ["gradcache", "cached"])
def test_several_embeddings_per_encoder_under_ddp_equal_one_process(ranks, name):
    image, text, clip, loss = two_embeddings_setup()
    want_loss = FullBatch([image, text], loss).step(*two_tower_batch())
    want = grads(image, text, clip)
    for rank_result in ranks:
        got = rank_result["two_embeddings"][name]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)
        assert torch.allclose(got["grads"]["2.logit_scale"], want["2.logit_scale"], rtol=1e-4)


SECOND_BATCH_SEED = 5


def held_no_sync_worker(rank, world_size, slices):
    """A caller accumulating over two steps holds DDP's no_sync over the first; the second synchronises."""
    results = {}
    for name in ("naive", "gradcache"):
        image, text, loss = two_tower_model()
        towers = [DistributedDataParallel(image), DistributedDataParallel(text)]
        strategy = STRATEGIES[name](towers, loss, 4)
        with contextlib.ExitStack() as held:
            for tower in towers:
                held.enter_context(tower.no_sync())
            strategy.step(*[rows(b, slices[rank]) for b in two_tower_batch()])
        strategy.step(*[rows(b, slices[rank]) for b in two_tower_batch(SECOND_BATCH_SEED)])
        results[name] = grads(image, text, loss)
    return results


@pytest.mark.parametrize("name", ["naive", "gradcache"])
def test_steps_under_the_callers_no_sync_reach_the_next_synchronised_step(ranks, name):
    """Plain DDP accumulation: what .grad gathered under the caller's no_sync is all-reduced by the first
    synchronising backward after it. So both steps' gradients, averaged over ranks, are on every rank: the sum of
    one process's gradients on each global batch (NaiveAccumulation: of its global micro-batches)."""
    _, first = reference("two_tower", name if name == "naive" else "full", 4)
    _, second = reference("two_tower", name if name == "naive" else "full", 4, SECOND_BATCH_SEED)
    want = {k: first[k] + second[k] for k in first}
    for rank_result in ranks:
        assert_grads_close(rank_result["held_no_sync"][name], want, 1e-5)


def test_all_gather_with_grad_for_a_loss_used_without_gradcache(ranks):
    results = [r["gather"] for r in ranks]
    image, text, loss = two_tower_model()
    batch = two_tower_batch()
    value = loss(image(batch[0]), text(**batch[1]))
    value.backward()
    want = grads(image, text, loss)
    for got in results:
        assert torch.allclose(got["loss"], value.detach(), rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)


def gather_worker(rank, world_size):
    image, text, loss = two_tower_model()
    towers = [DistributedDataParallel(image), DistributedDataParallel(text)]
    half = slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)
    local = [rows(b, half) for b in two_tower_batch()]
    value = loss(all_gather_with_grad(towers[0](local[0])), all_gather_with_grad(towers[1](**local[1])))
    value.backward()
    return {"loss": value.detach(), "grads": grads(image, text, loss)}


class WholeModel(nn.Module):
    """What Lightning, the Hugging Face Trainer and sentence-transformers hand DDP: the whole model, with a
    CachedLoss inside, so the DDP wrapper sits above encoders that are plain modules. `ordinary` runs the same
    parameters as one plain forward instead (the reference all-reduce count of one DDP step)."""

    def __init__(self, encoders, loss, chunk_size, options):
        super().__init__()
        self.cached = CachedLoss(encoders, loss, chunk_size, **options)
        self.ordinary = False

    def forward(self, *inputs):
        if not self.ordinary:
            return self.cached(*inputs)
        cache = self.cached.cache
        embeddings = [all_gather_with_grad(cache.embed([v])[0] if cache.shared_encoder is not None
                                           else cache.embed(inputs)[i]) for i, v in enumerate(inputs)]
        return cache.loss_fn(*embeddings)


SCALE = {"two_tower": 1.0, "shared": 4.0}  # a GradScaler-like factor on the loss reaches every gradient


def wrapped_worker(rank, world_size, model_name, slices, options):
    """DDP with its default options around the whole model; two steps, so an unfinished reduction would fail
    the second; the all-reduces of each are counted."""
    if model_name == "two_tower":
        image, text, loss = two_tower_model()
        encoders, modules, batch = [image, text], [image, text, loss], two_tower_batch()
    else:
        encoder, loss = shared_model()
        encoders, modules, batch = encoder, [encoder, loss], shared_batch()
    model = WholeModel(encoders, loss, 4, options)
    wrapped = DistributedDataParallel(model)
    calls = []

    def counting_hook(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)

    wrapped.register_comm_hook(dist.group.WORLD, counting_hook)
    local = [rows(b, slices[rank]) for b in batch]
    counts = {}
    for mode in ("ordinary", "cached", "cached"):
        model.ordinary = mode == "ordinary"
        wrapped.zero_grad(set_to_none=True)
        calls.clear()
        value = wrapped(*local)
        (value * SCALE[model_name]).backward()
        counts.setdefault(mode, []).append(len(calls))
    return {"loss": value.detach(), "grads": grads(*modules), "allreduce_calls": counts}


@pytest.mark.parametrize("model_name, variant", [(m, v) for m in ("two_tower", "shared")
                                                 for v in ["plain", *variant_names(m)]])
def test_ddp_around_the_whole_model_is_exact_and_synchronises_once(ranks, model_name, variant):
    """DDP's default options above plain encoders ("marked as ready twice" before): every chunk but each
    encoder's last reaches .grad without DDP's hooks, and one ordinary step's all-reduces sync the sum."""
    want_loss, want = reference(model_name, "full", 4)
    want = {k: v * SCALE[model_name] for k, v in want.items()}
    for rank_result in ranks:
        got = rank_result["wrapped"][model_name, variant]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)
        if model_name == "two_tower":
            assert torch.allclose(got["grads"]["2.logit_scale"], want["2.logit_scale"], rtol=1e-4)
        one_ddp_step = got["allreduce_calls"]["ordinary"][0]
        assert one_ddp_step >= 1
        assert got["allreduce_calls"]["cached"] == [one_ddp_step, one_ddp_step]
