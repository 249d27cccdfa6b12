"""`reuse_outputs`: a frozen submodule runs in phase (1) only, and the gradients equal those of the same step
without the option (the reference: GradCache re-running the module in phase (3), from the same seed), dropout on
before, inside and after the reused module; a trainable module or inputs that require grad are refused before
any gradient is left behind. GradCache, CachedLoss and the functional form; a toy encoder and a tiny Qwen2-VL."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcache import CachedLoss, GradCache
from gradcache.functional import cached, cat_input_tensor
from gradcache.graph_memory import GraphBudget
from gradcache.losses import InfoNCE
from tests.conftest import assert_grads_close, grads_of, zero


class Tower(nn.Module):
    """The frozen part: a linear layer with dropout inside; counts its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.dropout(torch.tanh(self.linear(x)))


class Encoder(nn.Module):
    """Dropout on the input (drawn before the tower), the tower, trainable layers with dropout after it."""

    def __init__(self, stem: bool = False) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8) if stem else nn.Identity()  # trainable before the tower: its input learns
        self.tower = Tower()
        self.head = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.GELU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.tower(self.stem(F.dropout(x, 0.2, self.training))))


def frozen_tower_encoder(stem: bool = False) -> Encoder:
    torch.manual_seed(0)
    encoder = Encoder(stem).double().train()
    encoder.tower.requires_grad_(False)
    return encoder


def batch(n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g, dtype=torch.float64), torch.randn(n, 8, generator=g, dtype=torch.float64)


def run(door: str, encoder: nn.Module, inputs, chunk_size: int, seed: int = 5, **options) -> dict:
    """One step through GradCache.step or CachedLoss's backward; the gradients, and the next draw of the caller's
    generator (phase (3) must leave it where phase (1) did)."""
    zero(encoder)
    torch.manual_seed(seed)
    if door == "GradCache":
        GradCache(encoder, InfoNCE(0.1), chunk_size, **options).step(*inputs)
    else:
        CachedLoss(encoder, InfoNCE(0.1), chunk_size, **options)(*inputs).backward()
    return {**trainable_grads(encoder), "next draw": torch.rand(3)}


def trainable_grads(encoder: nn.Module) -> dict:
    """The gradients of the parameters that learn (a frozen one's stays None, checked apart)."""
    frozen = {name for name, p in encoder.named_parameters() if not p.requires_grad}
    return {name: g for name, g in grads_of(encoder).items() if name.split(".", 1)[1] not in frozen}


def chunk_count(n: int, chunk_size: int, inputs: int = 2) -> int:
    return inputs * -(-n // chunk_size)


@pytest.mark.parametrize("door", ["GradCache", "CachedLoss"])
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_the_tower_runs_in_phase_one_only_and_the_gradients_are_those_without_it(door, chunk_size):
    encoder, inputs = frozen_tower_encoder(), batch()
    want = run(door, encoder, inputs, chunk_size)
    assert encoder.tower.calls == 2 * chunk_count(7, chunk_size)  # phases (1) and (3)
    encoder.tower.calls = 0
    got = run(door, encoder, inputs, chunk_size, reuse_outputs=[encoder.tower])
    assert encoder.tower.calls == chunk_count(7, chunk_size)  # phase (1) alone
    assert torch.equal(got.pop("next draw"), want.pop("next draw"))
    assert_grads_close(got, want, rel=1e-6)
    assert encoder.tower.linear.weight.grad is None


def test_a_tower_without_dropout_reused_gives_the_same_gradients():
    encoder, inputs = frozen_tower_encoder(), batch()
    encoder.tower.dropout.p = 0.0  # the tower draws nothing: no generator state kept, nothing to skip
    want = run("GradCache", encoder, inputs, 2)
    got = run("GradCache", encoder, inputs, 2, reuse_outputs=[encoder.tower])
    assert torch.equal(got.pop("next draw"), want.pop("next draw"))
    assert_grads_close(got, want, rel=1e-6)


def test_skipping_without_advancing_the_generators_would_be_wrong():
    """The negative control: the tower's draws matter to the rest of the model. Replaying the head from the state
    before the tower (as if the tower drew nothing) gives other masks and other gradients."""
    encoder, inputs = frozen_tower_encoder(), batch()
    want = run("GradCache", encoder, inputs, 3)
    from gradcache import reused_outputs

    restore = reused_outputs.RandomState.restore
    try:
        reused_outputs.RandomState.restore = lambda self: None  # skip without advancing
        got = run("GradCache", encoder, inputs, 3, reuse_outputs=[encoder.tower], check_recompute=False)
    finally:
        reused_outputs.RandomState.restore = restore
    got.pop("next draw"), want.pop("next draw")
    with pytest.raises(AssertionError):
        assert_grads_close(got, want, rel=1e-6)


def test_the_memory_budget_counts_the_kept_outputs():
    budget = GraphBudget(100)
    assert budget.keeps(60) and not budget.keeps(60) and budget.keeps(40) and budget.left == 0
    assert GraphBudget(None).keeps(10**15)


@pytest.mark.parametrize("memory_budget, runs_again", [(1, True), (10**9, False)])
def test_outputs_over_the_budget_run_the_tower_again_and_stay_exact(memory_budget, runs_again):
    """A budget of 1 byte keeps no graph and no output: the tower runs in phase (3) too. A budget holding every
    graph re-encodes nothing. Both exact."""
    encoder, inputs = frozen_tower_encoder(), batch()
    want = run("GradCache", encoder, inputs, 3)
    encoder.tower.calls = 0
    got = run("GradCache", encoder, inputs, 3, reuse_outputs=[encoder.tower], memory_budget=memory_budget)
    assert encoder.tower.calls == chunk_count(7, 3) * (2 if runs_again else 1)
    got.pop("next draw"), want.pop("next draw")
    assert_grads_close(got, want, rel=1e-6)


@pytest.mark.parametrize("door", ["GradCache", "CachedLoss"])
def test_a_trainable_module_is_refused_before_any_gradient(door):
    encoder, inputs = frozen_tower_encoder(), batch()
    encoder.tower.linear.bias.requires_grad_(True)
    make = GradCache if door == "GradCache" else CachedLoss
    with pytest.raises(ValueError, match=r"reuse_outputs\[0\] \(Tower\) has a parameter that requires grad \('linear.bias'\)"):
        make(encoder, InfoNCE(0.1), 3, reuse_outputs=[encoder.tower])
    encoder.tower.requires_grad_(False)
    strategy = make(encoder, InfoNCE(0.1), 3, reuse_outputs=[encoder.tower])
    encoder.tower.linear.weight.requires_grad_(True)  # unfrozen after the constructor: refused at the step
    zero(encoder)
    with pytest.raises(ValueError, match="requires grad"):
        strategy.step(*inputs) if door == "GradCache" else strategy(*inputs).backward()
    assert all(p.grad is None for p in encoder.parameters())
    assert encoder.tower.calls == 0  # refused before phase (1)


def test_a_module_whose_inputs_learn_is_refused_in_phase_three_leaving_no_gradient():
    encoder, inputs = frozen_tower_encoder(stem=True), batch()  # a trainable stem feeds the tower
    cache = GradCache(encoder, InfoNCE(0.1), 3, reuse_outputs=[encoder.tower])
    zero(encoder)
    with pytest.raises(ValueError, match="whose inputs require grad in phase \\(3\\) of input 0"):
        cache.step(*inputs)
    assert all(p.grad is None for p in encoder.parameters())


def test_bad_lists_are_refused_by_name():
    encoder = frozen_tower_encoder()
    with pytest.raises(TypeError, match="must be a list of submodules"):
        GradCache(encoder, InfoNCE(0.1), 3, reuse_outputs=encoder.tower)
    with pytest.raises(TypeError, match=r"reuse_outputs\[1\] must be an nn.Module"):
        GradCache(encoder, InfoNCE(0.1), 3, reuse_outputs=[encoder.tower, "tower"])
    with pytest.raises(ValueError, match=r"reuse_outputs\[1\] \(Linear\) is inside reuse_outputs\[0\]"):
        GradCache(encoder, InfoNCE(0.1), 3, reuse_outputs=[encoder.tower, encoder.tower.linear])
    elsewhere = Tower().requires_grad_(False)
    with pytest.raises(ValueError, match="is not a submodule of any encoder"):
        GradCache(encoder, InfoNCE(0.1), 3, reuse_outputs=[elsewhere]).step(*batch())


# --- the functional form -----------------------------------------------------------------------------------
def functional_step(encoder: nn.Module, inputs, chunk_size: int, **options) -> dict:
    """The original's loop over sub-batches: (1) each cached call, (2) the loss's backward, (3) the closures."""
    call = cached(**options)(lambda model, x: model(x)) if options else cached(lambda model, x: model(x))
    loss_fn = cat_input_tensor(InfoNCE(0.1))
    zero(encoder)
    torch.manual_seed(5)
    reps, closures = ([], []), ([], [])
    for side, x in enumerate(inputs):
        for piece in x.split(chunk_size):
            rep, closure = call(encoder, piece)
            reps[side].append(rep), closures[side].append(closure)
    loss_fn(*reps).backward()
    for side in (0, 1):
        for closure, rep in zip(closures[side], reps[side]):
            closure(rep)
    return trainable_grads(encoder)


def test_the_functional_form_reuses_the_tower_exactly():
    encoder, inputs = frozen_tower_encoder(), batch()
    want = functional_step(encoder, inputs, 3)
    encoder.tower.calls = 0
    got = functional_step(encoder, inputs, 3, reuse_outputs=[encoder.tower])
    assert encoder.tower.calls == chunk_count(7, 3)
    assert_grads_close(got, want, rel=1e-6)


def test_the_functional_form_refuses_a_trainable_module_and_learning_inputs():
    encoder, inputs = frozen_tower_encoder(), batch()
    with pytest.raises(ValueError, match="has a parameter that requires grad"):
        cached(reuse_outputs=[encoder.head])
    stemmed = frozen_tower_encoder(stem=True)
    with pytest.raises(ValueError, match="inputs require grad"):
        functional_step(stemmed, inputs, 3, reuse_outputs=[stemmed.tower])
    assert all(p.grad is None for p in stemmed.parameters())


# --- a tiny Qwen2-VL, its vision tower frozen ----------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2_vl():
    pytest.importorskip("transformers")
    from tests.vlm_models import VisionLanguageEncoder, qwen2_vl_batch, tiny_qwen2_vl

    model, processor = tiny_qwen2_vl(dropout=0.1)
    model.train().visual.requires_grad_(False)  # the language model learns, the tower is frozen
    # Dropout inside the tower too: its draws must be skipped and advanced in phase (3).
    model.visual.blocks[0].register_forward_hook(lambda module, args, output: F.dropout(output, 0.2, True))
    calls = []  # one entry per computation of the tower (its hooks run around a reused call too; this one not)
    model.visual.patch_embed.register_forward_pre_hook(lambda module, args: calls.append(1))
    queries, documents = qwen2_vl_batch(processor, 6, seed=0), qwen2_vl_batch(processor, 6, seed=1)
    return VisionLanguageEncoder(model), calls, (queries, documents)


@pytest.mark.slow  # a few seconds on 2 cores: about 70 forwards of a Qwen2-VL
@pytest.mark.parametrize("door", ["GradCache", "CachedLoss"])
@pytest.mark.parametrize("chunking", [{"chunk_size": 1}, {"chunk_size": 6, "chunk_tokens": 40}],
                         ids=["rows", "chunk_tokens"])
def test_a_qwen2_vl_tower_reused_runs_once_per_chunk_with_images_and_changes_no_gradient(qwen2_vl, door, chunking):
    """The processor's batch split by the library (no split_fn): the tower computes once per chunk holding
    images, where it computed twice, and every gradient is the same."""
    encoder, calls, inputs = qwen2_vl
    chunk_size, options = chunking["chunk_size"], {k: v for k, v in chunking.items() if k != "chunk_size"}
    calls.clear()
    want = run(door, encoder, inputs, chunk_size, **options)
    twice = len(calls)
    calls.clear()
    got = run(door, encoder, inputs, chunk_size, reuse_outputs=[encoder.model.visual], **options)
    assert 0 < len(calls) and 2 * len(calls) == twice  # the tower's computation in phase (1) only
    if chunk_size == 1:  # one chunk per row: the rows holding images, text-only rows never calling the tower
        assert len(calls) == sum(int(x["mm_token_type_ids"].any(1).sum()) for x in inputs) < chunk_count(6, 1)
    assert torch.equal(got.pop("next draw"), want.pop("next draw"))
    assert_grads_close(got, want, rel=1e-6)
    assert all(p.grad is None for p in encoder.model.visual.parameters())
