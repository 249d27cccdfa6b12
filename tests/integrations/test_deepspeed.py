"""DeepSpeed ZeRO stages 1, 2 and 3 as a GradCache encoder on two gloo ranks on CPU: the parameters and losses of
five AdamW steps (GradCache, CachedLoss, GradCache keeping graphs, FullBatch, DeepSpeed's own) against one process
on the concatenated global batch, ZeRO options passed through (CPU offload, small overlapped buckets),
NaiveAccumulation against the DDP tests' naive reference, the gradient reductions of each step, and the configs
and calls that cannot be exact.

What is counted: every reducing collective (all_reduce, reduce, reduce_scatter and their tensor forms) from the
step's first forward to the end of `engine.step()`, with the number of elements it reduces, split by caller:
DeepSpeed's (the parameter gradients) and gradcache's (the loss's all-gather with gradient, which all-reduces the
embeddings' gradient in the loss's backward, once per input as in FullBatch). One reduction per optimizer step means
DeepSpeed reduces as many gradient elements, in as many calls, as in one ordinary `FullBatch` step through the engine
(one forward, `engine.backward(loss)`: one bucketed reduction pass), however many chunks GradCache back-propagates;
two such backward passes before one step (the negative control) reduce twice as many.

One start of two ranks runs the three stages (each a fresh model and engine): deepspeed is imported once here
(on the CPU accelerator) and the ranks are forked from this process.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.distributed import all_gather_with_grad
from gradcache.losses import NTXent
from tests.conftest import assert_grads_close, mlp
from tests.multiprocess import run_on_ranks
from tests.test_distributed import reference as ddp_reference

if importlib.util.find_spec("deepspeed") is None:  # the torch-only CI stage; .[dev] installs it
    pytest.skip('deepspeed is not installed: pip install -e ".[deepspeed]"', allow_module_level=True)

GLOBAL, CHUNK, LR = 12, 2, 1e-2  # 6 rows per rank: 3 chunks per input, 6 chunk backward passes per step
# one AdamW step each, in this order, on the same engine; "ordinary" is DeepSpeed's own: one forward of both
# inputs' rows, engine.backward(loss)
STEPS = ("gradcache", "cached", "kept", "full", "ordinary")
STAGES = (1, 2, 3)
# ZeRO options passed through, one GradCache step each: CPU offload (ZeRO-3: parameters and optimizer; torch's
# AdamW there, not DeepSpeed's compiled CPU Adam), ZeRO-2's overlapped reduction in buckets smaller than one
# weight matrix, and ZeRO-3 partitioning every parameter (by default one under 100,000 elements, every one of this
# small model's, stays whole on each rank, and a forward gathers nothing)
PARTITIONED = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
ZERO_OPTIONS = {
    "partitioned": PARTITIONED,
    "offload": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                      "offload_optimizer": {"device": "cpu"}}, "zero_force_ds_cpu_optimizer": False},
    "buckets": {"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 100}},
}
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
            "_reduce_scatter_base", "all_reduce_coalesced")


def model():
    torch.manual_seed(0)
    return mlp()


def batch():
    g = torch.Generator().manual_seed(4)
    return torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 10, generator=g)


def loss_fn():
    return NTXent(temperature=0.2)


def config(stage, **extra):
    # gradient_clipping: DeepSpeed clips at 1.0 unless told otherwise; the reference does not clip
    return {"train_micro_batch_size_per_gpu": GLOBAL // 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage}, "steps_per_print": 10**9, **extra}


def engine_for(stage, module=None, **extra):
    import deepspeed

    module = module if module is not None else model()
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config(stage, **extra))
    return engine


@contextlib.contextmanager
def counted_reductions():
    """Record (caller, elements, function) of each outermost reducing torch.distributed call (an alias calling
    another counts once); elements: of its largest tensor argument (a reduce-scatter's input); the caller is
    "gradcache" for gradcache's own modules, else "deepspeed"."""
    calls, inside, originals = [], threading.local(), {}

    def elements(value):
        if isinstance(value, torch.Tensor):
            return value.numel()
        return sum(t.numel() for t in value) if isinstance(value, (list, tuple)) else 0

    def wrap(original):
        def counting(*args, **kwargs):
            if getattr(inside, "depth", 0) == 0:
                caller = sys._getframe(1).f_globals.get("__name__", "")
                largest = max(elements(v) for v in [*args, *kwargs.values()])
                who = "gradcache" if caller.startswith("gradcache") else "deepspeed"
                calls.append((who, largest, original.__name__))
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth -= 1
        return counting

    for name in REDUCING:
        if hasattr(dist, name):
            originals[name] = getattr(dist, name)
            setattr(dist, name, wrap(originals[name]))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def gathered(engine):
    """Every parameter, whole (ZeRO-3 holds a shard of each: gathered for the copy)."""
    from deepspeed.runtime.zero import GatheredParameters

    parameters = list(engine.module.named_parameters())
    with GatheredParameters([p for _, p in parameters]) if engine.zero_optimization_stage() == 3 else \
            contextlib.nullcontext():
        return {name: p.detach().clone() for name, p in parameters}


def one_step(name, engine, local):
    if name == "cached":
        loss = CachedLoss(engine, loss_fn(), CHUNK)(*local)
        loss.backward()  # not engine.backward(loss): refused below
        return loss.detach()
    if name == "full":
        return FullBatch(engine, loss_fn()).step(*local)
    if name == "ordinary":
        rows = local[0].shape[0]
        embeddings = engine(torch.cat(local))  # (2 * rows, D)
        loss = loss_fn()(all_gather_with_grad(embeddings[:rows]), all_gather_with_grad(embeddings[rows:]))
        engine.backward(loss)
        return loss.detach()
    options = {"memory_budget": 10**12} if name == "kept" else {}  # phase (1) keeps every graph
    return GradCache(engine, loss_fn(), CHUNK, **options).step(*local)


def stage_worker(rank, world_size, stage, calls):
    """Each step's reductions in its strategy's call (forward and backward) and in engine.step(), apart."""
    local = [b[rank * GLOBAL // 2:(rank + 1) * GLOBAL // 2] for b in batch()]
    engine = engine_for(stage)
    out = {"losses": [], "params": [], "reductions": {}, "step_reductions": {}}
    for name in STEPS:
        calls.clear()
        out["losses"].append(one_step(name, engine, local))
        out["reductions"][name] = list(calls)
        calls.clear()
        engine.step()
        out["step_reductions"][name] = list(calls)
        out["params"].append(gathered(engine))
    calls.clear()  # the negative control: two ordinary backward passes (half the rows each) before one step
    for half in (slice(0, GLOBAL // 4), slice(GLOBAL // 4, GLOBAL // 2)):
        one_step("ordinary", engine, [b[half] for b in local])
    out["reductions"]["two_backwards"] = list(calls)
    return out


def refusals_worker(rank, world_size, local):
    """What cannot be exact, on a ZeRO-2 engine: each error's message."""
    messages = {}
    for key, extra in {"gradient_accumulation_steps": {"gradient_accumulation_steps": 2},
                       "zero_optimization.stage": {"zero_optimization": {"stage": 0}}}.items():
        engine = engine_for(2, **extra)
        with pytest.raises(ValueError) as error:
            GradCache(engine, loss_fn(), CHUNK)
        messages[key] = str(error.value)
    engine = engine_for(2)
    with pytest.raises(RuntimeError) as error:
        engine.backward(CachedLoss(engine, loss_fn(), CHUNK)(*local))
    messages["engine.backward"] = str(error.value)
    GradCache(engine, loss_fn(), CHUNK).step(*local)
    with pytest.raises(RuntimeError) as error:
        GradCache(engine, loss_fn(), CHUNK).step(*local)
    messages["second step"] = str(error.value)
    engine.step()
    GradCache(engine, loss_fn(), CHUNK).step(*local)  # after engine.step(), the next step runs
    return messages


def all_stages_worker(rank, world_size):
    from deepspeed.utils import safe_get_full_grad

    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it; deepspeed.initialize asks for it
    # counting from before the first deepspeed.initialize: DeepSpeed's comm backend keeps the reduce-scatter
    # function it finds then
    with counted_reductions() as calls:
        results = {stage: stage_worker(rank, world_size, stage, calls) for stage in STAGES}
    local = [b[rank * GLOBAL // 2:(rank + 1) * GLOBAL // 2] for b in batch()]
    results["refusals"] = refusals_worker(rank, world_size, local)
    with counted_reductions() as calls:  # NaiveAccumulation's micro-batches, one reduction (ZeRO-2)
        torch.manual_seed(1)
        engine = engine_for(2, mlp())  # test_distributed's shared model: its naive reference
        loss = NaiveAccumulation(engine, NTXent(temperature=0.2), CHUNK).step(*local)
    grads = {f"0.{n}": safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}  # all-reduces
    results["naive"] = {"loss": loss, "reductions": calls, "grads": grads}
    for name, extra in ZERO_OPTIONS.items():
        engine = engine_for(extra["zero_optimization"]["stage"], **extra)
        loss = GradCache(engine, loss_fn(), CHUNK).step(*local)
        engine.step()
        results[name] = {"loss": loss, "params": gathered(engine)}
    results["uneven"] = uneven_ranks_worker(rank)
    return results


def uneven_ranks_worker(rank):
    """Partitioned ZeRO-3, whose every forward gathers: ranks of 7 and 5 rows in chunks of 4 (two chunks each) whose
    memory budgets would keep no graph and every graph, one step, agree to re-encode alike and step as one process;
    in chunks of 2 (four chunks and three) they are refused on every rank alike, not left waiting."""
    x, y = batch()
    mine = slice(0, 7) if rank == 0 else slice(7, GLOBAL)
    engine = engine_for(3, **PARTITIONED)
    loss = GradCache(engine, loss_fn(), 4, memory_budget=0 if rank == 0 else 10**12).step(x[mine], y[mine])
    engine.step()
    with pytest.raises(ValueError) as error:
        GradCache(engine_for(3, **PARTITIONED), loss_fn(), CHUNK).step(x[mine], y[mine])
    return {"loss": loss, "params": gathered(engine), "refused": str(error.value)}


@pytest.fixture(scope="module")
def ranks():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    return run_on_ranks(all_stages_worker, 2)


def reference():
    """One process, the global batch, plain autograd and torch's AdamW: losses and parameters after each step."""
    module, loss = model(), loss_fn()
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR)
    x, y = batch()
    losses, params = [], []
    for _ in STEPS:
        optimizer.zero_grad()
        value = loss(module(x), module(y))
        value.backward()
        optimizer.step()
        losses.append(value.detach())
        params.append({name: p.detach().clone() for name, p in module.named_parameters()})
    return losses, params


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_each_step_equals_the_full_batch_on_one_process(ranks, stage):
    """GradCache, CachedLoss, GradCache keeping graphs and FullBatch in turn, each followed by engine.step():
    every loss and every parameter after every step equals one process's AdamW on the global batch (ZeRO keeps
    float32 master weights: a few ulp)."""
    want_losses, want_params = reference()
    for result in ranks:
        got = result[stage]
        for step, name in enumerate(STEPS):
            assert torch.allclose(got["losses"][step], want_losses[step], rtol=1e-6, atol=0), (name, step)
            for key, want in want_params[step].items():
                error = (got["params"][step][key] - want).abs().max().item()
                assert error < 1e-6, f"stage {stage}, step {step} ({name}), {key}: {error:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ZERO_OPTIONS)
def test_zero_options_pass_through_exactly(ranks, name):
    want_losses, want_params = reference()
    for result in ranks:
        assert torch.allclose(result[name]["loss"], want_losses[0], rtol=1e-6, atol=0)
        for key, want in want_params[0].items():
            assert (result[name]["params"][key] - want).abs().max().item() < 1e-6, key


def parameter_reductions(calls):
    return [(elements, function) for caller, elements, function in calls if caller == "deepspeed"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_one_reduction_per_optimizer_step(ranks, stage):
    """Six chunk backward passes (and FullBatch's two forwards) reduce the parameter gradients as one ordinary
    DeepSpeed step does: the same calls of the same sizes (ZeRO-1 and ZeRO-2: one all-reduce of the bucket here;
    ZeRO-3: one reduce-scatter), the loss's two embedding all-reduces as FullBatch's, and engine.step()'s own
    (a one-element norm) alike; under ZeRO-3 a memory budget adds the ranks' agreement on how many graphs they
    keep. Two ordinary backward passes before one step reduce twice (the counter sees a per-chunk reduction)."""
    parameters = sum(p.numel() for p in model().parameters())
    for result in ranks:
        counts, at_step = result[stage]["reductions"], result[stage]["step_reductions"]
        one_step_reductions = parameter_reductions(counts["ordinary"])
        assert sum(n for n, _ in one_step_reductions) >= parameters  # every gradient element (ZeRO may pad)
        for name in ("gradcache", "cached", "kept", "full"):
            # ZeRO-3 runs the ranks in lockstep: with a memory budget they first agree how many graphs each keeps
            # (one all-reduce of a count per input)
            agreed = [("gradcache", 2, "all_reduce")] if name == "kept" and stage == 3 else []
            assert sorted(counts[name]) == sorted(counts["ordinary"] + agreed), name
            assert sorted(at_step[name]) == sorted(at_step["ordinary"]), name
        assert sorted(parameter_reductions(counts["two_backwards"])) == sorted(2 * one_step_reductions)


@pytest.mark.slow
def test_naive_accumulation_reduces_its_micro_batches_once(ranks):
    """NaiveAccumulation's three micro-batch backward passes: their mean's gradient (the DDP tests' naive
    reference), reduced in one call as DeepSpeed's own step reduces."""
    want_loss, want = ddp_reference("shared", "naive", CHUNK)
    for result in ranks:
        got = result["naive"]
        assert torch.allclose(got["loss"], want_loss, rtol=1e-5)
        assert_grads_close(got["grads"], {k: v for k, v in want.items() if k.startswith("0.")}, 1e-5)
        assert parameter_reductions(got["reductions"]) == parameter_reductions(result[2]["reductions"]["ordinary"])


@pytest.mark.slow
def test_partitioned_ranks_run_as_many_chunks_as_each_other(ranks):
    want_losses, want_params = reference()
    for result in ranks:
        got = result["uneven"]
        assert torch.allclose(got["loss"], want_losses[0], rtol=1e-6, atol=0)
        for key, want in want_params[0].items():
            assert (got["params"][key] - want).abs().max().item() < 1e-6, key
        assert "different numbers of chunks (per rank, per input: [[4, 4], [3, 3]])" in got["refused"]


@pytest.mark.slow
def test_what_cannot_be_exact_is_refused(ranks):
    messages = ranks[0]["refusals"]
    assert "gradient_accumulation_steps is 2" in messages["gradient_accumulation_steps"]
    assert "zero_optimization.stage is 0" in messages["zero_optimization.stage"]
    assert "loss.backward()" in messages["engine.backward"]
    assert "engine.step() after each GradCache step" in messages["second step"]


