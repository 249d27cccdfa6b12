"""GradCacheTrainer under `TrainingArguments(deepspeed=...)`, ZeRO stages 1, 2 and 3 on two gloo ranks on CPU: two
Trainer steps (AdamW, fp32, two chunks per rank and input) against one process computing the full batch of both
ranks with plain autograd and torch's AdamW (the losses the Trainer logs, the gradient norms it logs, and every
parameter after the two steps), and the gradient reductions of each optimizer step against those of DeepSpeed's own
ordinary step of the same model in the same Trainer.

What is counted (tests/integrations/test_deepspeed.py's `counted_reductions`): every reducing torch.distributed
call from a step's start to its end, with the number of elements it reduces and who called it. One reduction per
optimizer step means DeepSpeed's calls equal, in number and size, those of the ordinary step, where one forward
and one `engine.backward(loss)` reduce each gradient once. The negative control runs GradCache's chunks through
the same engine without the coalescing block: the second chunk's backward would reduce a gradient again, which
ZeRO-2 and ZeRO-3 refuse with an AssertionError.

One start of two ranks runs every case (deepspeed imported once here, the ranks forked).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import traceback

import pytest
import torch

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("deepspeed") is None:  # the torch-only CI stage; .[dev] installs it
    pytest.skip('deepspeed is not installed: pip install -e ".[deepspeed]"', allow_module_level=True)

from gradcache import CachedLoss, deepspeed_engine  # noqa: E402
from gradcache.integrations import huggingface  # noqa: E402
from gradcache.integrations.huggingface import GradCacheTrainer  # noqa: E402
from gradcache.losses import ClipLoss  # noqa: E402
from tests.integrations.test_deepspeed import counted_reductions, parameter_reductions  # noqa: E402
from tests.integrations.towers import CHUNK, Ordinary, Pairs, build_towers, collate, concatenated  # noqa: E402
from tests.multiprocess import run_on_ranks  # noqa: E402

STAGES = (1, 2, 3)
PER_RANK, STEPS, LR = 4, 2, 1e-2  # chunks of 3 and 1 rows per rank and input (CHUNK = 3)


def towers():
    """The trainer tests' towers with a fixed temperature: DeepSpeed's engine cannot broadcast a 0-dim parameter."""
    image, text, _ = build_towers()
    return image, text, ClipLoss(temperature=0.1, learnable=False)


def ds_config(stage: int, **extra) -> dict:
    # the batch keys and the clipping ("auto": the Trainer's max_grad_norm=0, no clipping) as the Trainer fills them
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "zero_optimization": {"stage": stage}, "steps_per_print": 10**9, **extra}


class StepReductions(transformers.TrainerCallback):
    """The reductions of each optimizer step: DeepSpeed steps inside the Trainer's backward, so the step's
    calls are those between its begin and end."""

    def __init__(self, calls: list) -> None:
        self.calls, self.steps, self.start = calls, [], 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = len(self.calls)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(list(self.calls[self.start:]))


class Recording(GradCacheTrainer):
    """Keeps every batch compute_loss saw and the model it was called with."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        self.batches = [*getattr(self, "batches", []), copy.deepcopy(inputs)]
        self.wrapper = type(model).__name__
        return super().compute_loss(model, inputs, return_outputs, **kwargs)


class OrdinaryTrainer(transformers.Trainer):
    """DeepSpeed's own step of the same model: one forward of the full local batch, `engine.backward(loss)`."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        self.batches = [*getattr(self, "batches", []), copy.deepcopy(inputs)]
        return model(inputs["image"], inputs["text"])


def train(folder: str, stage: int, calls: list, ordinary: bool = False, kept: bool = False, **overrides) -> dict:
    from accelerate.state import AcceleratorState
    from deepspeed.runtime.zero import GatheredParameters

    AcceleratorState._reset_state(True)  # each run its own accelerator; a forked rank starts without the parent's
    options = dict(
        per_device_train_batch_size=PER_RANK, max_steps=STEPS, learning_rate=LR, max_grad_norm=0.0,
        lr_scheduler_type="constant", use_cpu=True, remove_unused_columns=False, report_to=[], save_strategy="no",
        logging_strategy="steps", logging_steps=1, disable_tqdm=True, deepspeed=ds_config(stage),
    )
    args = transformers.TrainingArguments(folder, **{**options, **overrides})
    image, text, loss = towers()
    counter = StepReductions(calls)
    common = dict(train_dataset=Pairs(16), data_collator=collate, callbacks=[counter])
    if ordinary:
        trainer = OrdinaryTrainer(model=Ordinary(image, text, loss), args=args, **common)
    else:
        options = {"memory_budget": 10**12} if kept else {}  # kept: phase (1) keeps every chunk's graph
        trainer = Recording(CachedLoss([image, text], loss, chunk_size=CHUNK, **options), args,
                            input_names=("image", "text"), **common)
    trainer.train()
    parameters = list(trainer.model_wrapped.module.parameters())  # image tower, then text tower
    with GatheredParameters(parameters) if stage == 3 else contextlib.nullcontext():  # ZeRO-3 holds shards
        whole = [p.detach().clone() for p in parameters]
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {"batches": trainer.batches, "params": whole, "losses": [e["loss"] for e in logged],
            "grad_norms": [e["grad_norm"] for e in logged], "reductions": counter.steps,
            "wrapper": getattr(trainer, "wrapper", None)}


@contextlib.contextmanager
def chunks_reduced_one_by_one(engine):
    """The negative control for `reduced_once_above_the_loss`: every chunk's backward an ordinary one, as there,
    but no coalescing block around them."""
    deepspeed_engine._ABOVE_THE_LOSS.append(engine)
    try:
        yield
    finally:
        deepspeed_engine._ABOVE_THE_LOSS.pop()


def refusal(folder: str, stage: int, **overrides) -> str:
    try:
        train(folder, stage, [], **overrides)
    except ValueError as error:
        return str(error)
    return "not refused"


def worker(rank: int, world_size: int, folder: str) -> dict:
    from accelerate.state import AcceleratorState

    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    out = {}
    # counting from before the first engine: DeepSpeed's comm backend keeps the reduce-scatter it finds then
    with counted_reductions() as calls:
        for stage in STAGES:
            out[stage] = {name: train(os.path.join(folder, f"{name}{stage}-{rank}"), stage, calls, ordinary)
                          for name, ordinary in (("gradcache", False), ("ordinary", True))}
        out[3]["kept"] = train(os.path.join(folder, f"kept3-{rank}"), 3, calls, kept=True)
        original, huggingface.reduced_once_above_the_loss = huggingface.reduced_once_above_the_loss, \
            chunks_reduced_one_by_one
        try:
            for stage in (2, 3):
                try:
                    out[f"one_by_one{stage}"] = train(os.path.join(folder, f"one-by-one{stage}-{rank}"), stage, calls,
                                                      max_steps=1)
                except AssertionError as error:  # DeepSpeed's own refusal of a second reduction
                    site = traceback.extract_tb(error.__traceback__)[-1]
                    out[f"one_by_one{stage}"] = {"error": str(error), "site": f"{site.name}: {site.line}"}
                    AcceleratorState._reset_state(True)
        finally:
            huggingface.reduced_once_above_the_loss = original
    out["accumulation"] = refusal(os.path.join(folder, f"gas-{rank}"), 2, gradient_accumulation_steps=2)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    return run_on_ranks(worker, 2, str(tmp_path_factory.mktemp("hf-deepspeed")))


def reference(batches: list[dict]) -> tuple[list[float], list[float], list[torch.Tensor]]:
    """One process, each step's batch of both ranks at once, plain autograd and torch's AdamW (the Trainer's
    defaults: no weight decay, betas (0.9, 0.999), eps 1e-8, constant lr): losses, gradient norms, parameters."""
    image, text, loss = towers()
    parameters = [*image.parameters(), *text.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for batch in batches:
        optimizer.zero_grad()
        value = loss(image(batch["image"]), text(**batch["text"]))
        value.backward()
        losses.append(value.item())
        norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters])).item())
        optimizer.step()
    return losses, norms, [p.detach() for p in parameters]


def global_batches(ranks: list[dict], stage: int, name: str) -> list[dict]:
    return [concatenated([r[stage][name]["batches"][step] for r in ranks]) for step in range(STEPS)]


@pytest.mark.slow
@pytest.mark.parametrize("stage, name", [*((s, n) for s in STAGES for n in ("gradcache", "ordinary")), (3, "kept")])
def test_two_trainer_steps_equal_the_full_batch_on_one_process(ranks, stage, name):
    """The logged losses and gradient norms of both steps, and every parameter after them (a few float32 ulp:
    ZeRO keeps float32 master weights); "kept": ZeRO-3 with every chunk's graph kept from phase (1)
    (`memory_budget`), back-propagated in phase (3) without re-encoding."""
    losses, norms, parameters = reference(global_batches(ranks, stage, name))
    for r in ranks:
        got = r[stage][name]
        assert got["wrapper"] in ("DeepSpeedEngine", None)
        assert got["losses"] == pytest.approx(losses, rel=1e-6)
        assert got["grad_norms"] == pytest.approx(norms, rel=1e-5)
        assert len(got["params"]) == len(parameters)
        for i, (g, w) in enumerate(zip(got["params"], parameters)):
            error = (g - w).abs().max().item()
            assert error < 1e-6, f"stage {stage}, {name}, parameter {i}: {error:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_one_reduction_per_optimizer_step(ranks, stage):
    """Two chunks per input and rank, four chunk backward passes per step: DeepSpeed reduces the parameter
    gradients once (one all-reduce, or under ZeRO-3 one reduce-scatter, of every gradient element), in the same
    calls of the same sizes as its own ordinary step, and the loss's gather all-reduces as the ordinary step's
    does."""
    parameters = sum(p.numel() for p in (*towers()[0].parameters(), *towers()[1].parameters()))
    for r in ranks:
        ours, ordinary = r[stage]["gradcache"]["reductions"], r[stage]["ordinary"]["reductions"]
        assert len(ours) == len(ordinary) == STEPS
        for step in range(STEPS):
            assert sorted(ours[step]) == sorted(ordinary[step]), step
            # one call reduces every gradient element (ZeRO may pad); the others are engine.step()'s 1-element norms
            gradients = [n for n, _ in parameter_reductions(ours[step]) if n > 1]
            assert len(gradients) == 1 and gradients[0] >= parameters, ours[step]


@pytest.mark.slow
def test_without_the_coalescing_block_deepspeed_would_reduce_a_gradient_twice(ranks):
    """The negative control: the same chunk backward passes without `reduced_once_above_the_loss`'s coalescing.
    ZeRO-2 and ZeRO-3 reduce a parameter's gradient as soon as a chunk's backward writes it, so the next chunk's
    gradient of the same parameter would be a second reduction, which DeepSpeed refuses (its own assertions)."""
    for r in ranks:
        assert "has already been reduced" in r["one_by_one2"]["error"]
        # ZeRO-3: the second chunk's gradient of a parameter queued in a bucket already holding it
        assert "len(set(p.ds_id for p in params_in_bucket)) == len(params_in_bucket)" in r["one_by_one3"]["site"]


@pytest.mark.slow
def test_deepspeed_accumulation_is_refused_naming_the_key(ranks):
    for r in ranks:
        assert "GradCacheTrainer: gradient_accumulation_steps is 2" in r["accumulation"]
        assert "set it to 1" in r["accumulation"]


def test_a_learnable_temperature_is_refused_under_deepspeed(tmp_path):
    image, text, _ = build_towers()
    cached = CachedLoss([image, text], ClipLoss(temperature=0.1, learnable=True), chunk_size=CHUNK)
    args = transformers.TrainingArguments(str(tmp_path), use_cpu=True, remove_unused_columns=False, report_to=[],
                                          deepspeed=ds_config(2))
    with pytest.raises(ValueError, match=r"0-dim parameters \['loss_fn.logit_scale'\].*learnable=False"):
        GradCacheTrainer(cached, args, input_names=("image", "text"))
