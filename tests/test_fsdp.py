"""Two gloo ranks on CPU: every strategy with FSDP2-sharded encoders against one process on the concatenated
global batch, and the number of gradient reductions (reduce-scatters) per step in each `fsdp_reduce` mode.

Spawned ranks cost ~30 s on two cores before any case runs (each imports torch, and FSDP2 imports the compiler
stack), so ONE start of two ranks runs the cases of this file and of tests/train/parallel/test_fsdp.py (`fsdp_runs`),
and the ranks are forked from this process after it has imported those modules once (~18 s in all).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import tempfile

import pytest
import torch
import torch._dynamo  # noqa: F401  imported once here, inherited by the forked ranks
import torch.distributed as dist
import torch.distributed.checkpoint  # noqa: F401
from torch import nn
from torch.distributed.fsdp import fully_shard

from gradcache import FullBatch, GradCache
from tests.conftest import assert_grads_close
from tests.multiprocess import run_on_ranks
from tests.test_distributed import GLOBAL, STRATEGIES, VARIANTS, reference, rows, shared_batch, shared_model
from tests.test_distributed import two_tower_batch, two_tower_model

CHUNK = 2  # 6 rows per rank: 3 chunks (micro-batches) per input per step
MODES = ("chunk", "step")


def shard(module: nn.Module, reshard_after_forward: bool = True) -> None:
    """fully_shard every child that holds parameters (the blocks), then the module: several groups per tower."""
    for child in module.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, reshard_after_forward=reshard_after_forward)
    fully_shard(module, reshard_after_forward=reshard_after_forward)


def full_grads(*modules: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered from the shards (a plain tensor where a module is not sharded)."""
    out = {}
    for i, module in enumerate(modules):
        for name, p in module.named_parameters():
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[f"{i}.{name}"] = grad.detach().clone()
    return out


@contextlib.contextmanager
def counted(*names: str):
    """Count calls of the first existing torch.distributed function among each group of `names` (FSDP2 calls
    `reduce_scatter_single` / `all_gather_single` in torch 2.14; the `*_tensor` names are older aliases)."""
    counts, originals = {}, {}
    for group in names:
        name = next(n for n in group.split("|") if hasattr(dist, n))
        counts[group.split("|")[0]] = 0
        originals[name] = original = getattr(dist, name)

        def wrapper(*args, _key=group.split("|")[0], _original=original, **kwargs):
            counts[_key] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, wrapper)
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def one_step(name, encoders, loss, inputs, mode):
    strategy = STRATEGIES[name](encoders, loss, CHUNK, fsdp_reduce=mode)  # FullBatch ignores CHUNK
    if name == "cached":
        value = strategy(*inputs)
        value.backward()
        return value.detach()
    return strategy.step(*inputs)


COLLECTIVES = ("reduce_scatter_single|reduce_scatter_tensor", "all_gather_single|all_gather_into_tensor")


def strategy_worker(rank, model_name, reshard_after_forward=True, names=tuple(STRATEGIES), modes=MODES):
    results = {}
    for name in names:
        for mode in modes if name != "full" else ("chunk",):  # FullBatch runs one backward: nothing to choose
            if model_name == "two_tower":
                image, text, loss = two_tower_model()
                towers, batch = [image, text], two_tower_batch()
            else:
                encoder, loss = shared_model()
                towers, batch = [encoder], shared_batch()
            for tower in towers:
                shard(tower, reshard_after_forward)
            half = slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)
            local = [rows(b, half) for b in batch]
            encoders = towers if model_name == "two_tower" else towers[0]
            with counted(*COLLECTIVES) as counts:
                value = one_step(name, encoders, loss, local, mode)
            results[name, mode] = {"loss": value, "grads": full_grads(*towers, loss), **counts}
    return results


def variants_worker(rank):
    """Ranks with 7 and 5 rows (an epoch's last batch); towers whose blocks are sharded but whose root is not."""
    results = {}
    image, text, loss = two_tower_model()
    shard(image), shard(text)
    local = [rows(b, slice(0, 7) if rank == 0 else slice(7, GLOBAL)) for b in two_tower_batch()]
    try:  # chunks of 2: 4 chunks on rank 0, 3 on rank 1
        one_step("gradcache", [image, text], loss, local, "chunk")
    except ValueError as error:
        results["uneven_error"] = str(error)
    value = GradCache([image, text], loss, 4).step(*local)  # chunks of 4: 2 chunks on each rank
    results["uneven"] = {"loss": value, "grads": full_grads(image, text, loss)}
    for name, mode in (("full", "chunk"), ("gradcache", "step")):
        image, text, loss = two_tower_model()
        for tower in (image, text):
            for child in tower.children():
                if any(True for _ in child.parameters()):
                    fully_shard(child)
        local = [rows(b, slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)) for b in two_tower_batch()]
        with counted(*COLLECTIVES) as counts:
            value = one_step(name, [image, text], loss, local, mode)
        results["blocks_only", name] = {"loss": value, "grads": full_grads(image, text, loss), **counts}
    return results


def options_worker(rank):
    """GradCache's memory_budget and chunk_tokens on sharded towers, in each mode; and ranks that would keep and
    chunk differently (7 and 5 rows, budgets of 0 and everything): they agree on the counts."""
    results = {}
    for variant, options in VARIANTS.items():
        for mode in MODES:
            image, text, loss = two_tower_model()
            shard(image), shard(text)
            local = [rows(b, slice(rank * GLOBAL // 2, (rank + 1) * GLOBAL // 2)) for b in two_tower_batch()]
            with counted(*COLLECTIVES) as counts:
                value = GradCache([image, text], loss, CHUNK, fsdp_reduce=mode, **options).step(*local)
            results[variant, mode] = {"loss": value, "grads": full_grads(image, text, loss), **counts}
    image, text, loss = two_tower_model()
    shard(image), shard(text)
    local = [rows(b, slice(0, 7) if rank == 0 else slice(7, GLOBAL)) for b in two_tower_batch()]
    value = GradCache([image, text], loss, 4, chunk_tokens=[None, 24],
                      memory_budget=0 if rank == 0 else 10**12).step(*local)
    results["disagreeing"] = {"loss": value, "grads": full_grads(image, text, loss)}
    return results


def all_cases_worker(rank, world_size, folder):
    from tests.train.parallel.test_cli_fsdp import cli_worker
    from tests.train.parallel.test_fsdp import train_worker

    return {
        "two_tower": strategy_worker(rank, "two_tower"),
        "shared": strategy_worker(rank, "shared"),
        "gathered": strategy_worker(rank, "two_tower", False, ("gradcache", "full"), ("chunk",)),
        "variants": variants_worker(rank),
        "options": options_worker(rank),
        "train": train_worker(rank, world_size, folder),
        "cli": cli_worker(rank, world_size, folder),
    }


@functools.lru_cache(maxsize=None)
def fsdp_runs() -> tuple[list[dict], str]:
    """Each rank's results, and the folder the ranks wrote checkpoints to (removed when pytest exits)."""
    folder = tempfile.mkdtemp(prefix="gradcache-fsdp-")
    atexit.register(shutil.rmtree, folder, True)
    return run_on_ranks(all_cases_worker, 2, folder), folder  # forked: gloo on loopback, one thread per rank


@pytest.fixture(scope="module")
def ranks():
    return fsdp_runs()[0]


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["two_tower", "shared"])
@pytest.mark.parametrize(("name", "mode"), [(n, m) for n in STRATEGIES for m in MODES if (n, m) != ("full", "step")])
def test_fsdp_gradients_equal_single_process_on_the_global_batch(ranks, name, model_name, mode):
    """Gathered from the shards, every gradient (the learnable temperature included) is the single-process one:
    FSDP2 averages its reduce-scatter over ranks exactly as DDP averages its all-reduce."""
    want_loss, want = reference(model_name, name, CHUNK)
    for rank_result in ranks:
        got = rank_result[model_name][name, mode]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5), (got["loss"], want_loss)
        assert_grads_close(got["grads"], want, 1e-5)
        if model_name == "two_tower":
            assert torch.allclose(got["grads"]["2.logit_scale"], want["2.logit_scale"], rtol=1e-5)


# backward passes per step that reduce in "chunk" mode: 3 chunks per rank; the shared encoder of SimCLR runs a
# backward per chunk of each view in GradCache (6) and one per micro-batch of both views in NaiveAccumulation (3)
BACKWARDS = {"two_tower": {"gradcache": 3, "cached": 3, "naive": 3},
             "shared": {"gradcache": 6, "cached": 6, "naive": 3}}


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["two_tower", "shared"])
def test_reductions_per_step_in_each_mode(ranks, model_name):
    """"step": one reduce-scatter per sharded group per step, as many as one FullBatch step; "chunk": one per
    group per backward pass."""
    runs = ranks[0][model_name]
    one_step_count = runs["full", "chunk"]["reduce_scatter_single"]
    assert one_step_count >= 2  # several sharded groups
    for name, backwards in BACKWARDS[model_name].items():
        assert runs[name, "chunk"]["reduce_scatter_single"] == backwards * one_step_count, name
        if name == "naive" and model_name == "shared":
            # FSDP2 (torch 2.14) reduce-scatters one group twice when a module runs twice in the forward that
            # ends accumulation (both views here); still far fewer than per micro-batch, and exact
            assert one_step_count <= runs[name, "step"]["reduce_scatter_single"] <= one_step_count + 1
        else:
            assert runs[name, "step"]["reduce_scatter_single"] == one_step_count, name


@pytest.mark.slow
def test_reshard_after_forward_false_gathers_less_and_stays_exact(ranks):
    """Keeping gathered parameters between a chunk's forward and backward saves all-gathers, not exactness."""
    resharded, gathered = ranks[0]["two_tower"]["gradcache", "chunk"], ranks[0]["gathered"]["gradcache", "chunk"]
    assert gathered["all_gather_single"] < resharded["all_gather_single"]
    want_loss, want = reference("two_tower", "gradcache", CHUNK)
    for rank_result in ranks:
        got = rank_result["gathered"]["gradcache", "chunk"]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)


@pytest.mark.slow
def test_uneven_ranks_need_the_same_number_of_chunks_under_fsdp(ranks):
    """Every chunk's forward is a collective under FSDP2: 4 chunks against 3 is refused on every rank before any
    gradient is written; 7 and 5 rows in 2 chunks each are exact."""
    for rank_result in ranks:
        message = rank_result["variants"]["uneven_error"]
        assert "different numbers of chunks (per rank, per input: [[4, 4], [3, 3]])" in message
    want_loss, want = reference("two_tower", "gradcache", CHUNK)
    for rank_result in ranks:
        got = rank_result["variants"]["uneven"]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)


@pytest.mark.slow
def test_sharded_blocks_inside_a_plain_module_are_found(ranks):
    """fully_shard on the blocks only: gradient_sync still finds them, so "step" reduces once per step."""
    runs = ranks[0]["variants"]
    once = runs["blocks_only", "full"]["reduce_scatter_single"]
    assert runs["blocks_only", "gradcache"]["reduce_scatter_single"] == once
    want_loss, want = reference("two_tower", "gradcache", CHUNK)
    for rank_result in ranks:
        got = rank_result["variants"]["blocks_only", "gradcache"]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)


def test_fsdp_reduce_is_checked_before_anything_runs():
    image, text, loss = two_tower_model()
    for cls in STRATEGIES.values():
        with pytest.raises(ValueError, match="fsdp_reduce must be 'chunk'.*got 'once'"):
            cls([image, text], loss, CHUNK, fsdp_reduce="once")
    with pytest.raises(ValueError, match="fsdp_reduce"):
        FullBatch([image, text], loss, fsdp_reduce=None)


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", MODES)
def test_memory_budget_and_chunk_tokens_under_fsdp(ranks, variant, mode):
    """Exact on every parameter; "step" still reduce-scatters once per step; "chunk" once per backward, and the
    kept graphs of a tower are back-propagated in one (a budget holding every chunk: 2 backwards per tower,
    the kept ones and the re-encoded last chunk, against 3 without a budget)."""
    want_loss, want = reference("two_tower", "full", CHUNK)
    for rank_result in ranks:
        got = rank_result["options"][variant, mode]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)
    one_step_count = ranks[0]["two_tower"]["full", "chunk"]["reduce_scatter_single"]
    count = ranks[0]["options"][variant, mode]["reduce_scatter_single"]
    if mode == "step":
        assert count == one_step_count
    elif variant == "budget_all":
        assert count == 2 * one_step_count
    else:
        assert count <= ranks[0]["two_tower"]["gradcache", "chunk"]["reduce_scatter_single"]


@pytest.mark.slow
def test_ranks_agree_on_kept_and_token_chunk_counts(ranks):
    want_loss, want = reference("two_tower", "full", CHUNK)
    for rank_result in ranks:
        got = rank_result["options"]["disagreeing"]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], want, 1e-5)
