"""Matryoshka: the sum over dims of the brute-force formula on truncated, re-normalised embeddings (sentence-transformers'
shrink), dense and tiled; exact under GradCache and CachedLoss against FullBatch on every parameter (the inner loss's
learnable temperature and bias included), NaiveAccumulation the negative control; one full-width queue read once and
pushed once per call, against a queue kept by hand; bad input refused before anything changes."""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import ClipLoss, InfoNCE, Matryoshka, NTXent, SigLipLoss
from gradcache.losses.queue import EmbeddingQueue
from tests.conftest import TokenEncoder, assert_grads_close, mlp, run_strategy, tokens, zero
from tests.losses import brute_force
from tests.losses.cases import CASE_IDS, CASES, loss_and_grads


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., nn.Module]  # make(tile_size=, column_tile_size=, queue_size=) -> the inner loss, float64
    brute: Callable[[nn.Module, list[torch.Tensor], list[torch.Tensor | None]], torch.Tensor]  # (loss, inputs, queues)
    pushed: Callable[[list[torch.Tensor]], list[torch.Tensor]]  # inputs -> the rows each queue receives
    hard_negatives: int = 0

    def inputs(self, n: int, d: int, seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        first = torch.randn(n, d, generator=g, dtype=torch.float64)
        tensors = [first, 2.0 * (first + 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64))]
        if self.hard_negatives:
            tensors.append(torch.randn(n * self.hard_negatives, d, generator=g, dtype=torch.float64))
        return tensors


def _infonce(symmetric: bool, hard: int) -> Case:
    return Case(f"infonce{'_symmetric' if symmetric else ''}{'_hard' if hard else ''}",
                lambda **kw: InfoNCE(temperature=0.1, symmetric=symmetric, **kw),
                lambda loss, x, q: brute_force.infonce(x[0], x[1], x[2] if len(x) > 2 else None, 0.1, symmetric,
                                                       queue=q[0]),
                lambda x: [torch.cat(x[1:])], hard)


CASES_BY_NAME = {case.name: case for case in [
    _infonce(False, 0), _infonce(True, 2),
    Case("ntxent", lambda **kw: NTXent(temperature=0.5, **kw),
         lambda loss, x, q: brute_force.ntxent(x[0], x[1], 0.5, queue=q[0]), lambda x: [torch.cat(x)]),
    Case("clip", lambda **kw: ClipLoss(temperature=0.1, **kw).double(),
         lambda loss, x, q: brute_force.clip(x[0], x[1], loss.logit_scale, *q), lambda x: [x[0], x[1]]),
    Case("siglip", lambda **kw: SigLipLoss(temperature=0.1, bias=-2.0, **kw).double(),
         lambda loss, x, q: brute_force.siglip(x[0], x[1], loss.logit_scale, loss.bias, *q), lambda x: [x[0], x[1]]),
]}
TILINGS = {"dense": {}, "tiled": dict(tile_size=3, column_tile_size=4)}


def shrink(rows: torch.Tensor | None, dim: int) -> torch.Tensor | None:
    """sentence-transformers' shrink: the first ``dim`` columns, L2-normalised."""
    return None if rows is None else F.normalize(rows[:, :dim], dim=1)


def by_formula(case: Case, loss: nn.Module, inputs, dims, weights, queues=None) -> torch.Tensor:
    """sum_k w_k * the brute-force loss on the shrunk inputs (and the shrunk full-width queues)."""
    queues = queues or [None, None]
    return sum(w * case.brute(loss, [shrink(x, d) for x in inputs], [shrink(q, d) for q in queues])
               for d, w in zip(dims, weights))


def queues_of(loss: nn.Module) -> list[EmbeddingQueue]:
    return [m for m in loss.modules() if isinstance(m, EmbeddingQueue)]


# --- the formula -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims, weights", [((7, 4, 1), None), ((5, 2), (0.5, 2.0))])  # dims[0] = or < width
@pytest.mark.parametrize("tiling", list(TILINGS))
@pytest.mark.parametrize("name", list(CASES_BY_NAME))
def test_value_and_gradients_equal_the_sum_over_dims_of_the_formula(name, tiling, dims, weights):
    case = CASES_BY_NAME[name]
    inner = case.make(**TILINGS[tiling])
    inputs = case.inputs(4, 7, seed=1)
    got, got_inputs, got_parameters = loss_and_grads(Matryoshka(inner, dims, weights=weights), inputs)

    leaves = [x.clone().requires_grad_() for x in inputs]
    parameters = list(inner.parameters())  # the learnable temperature (and bias): one, shared by every dim
    want = by_formula(case, inner, leaves, dims, weights or [1.0] * len(dims))
    want_grads = torch.autograd.grad(want, leaves + parameters)
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=0)
    for g, w in zip(got_inputs + got_parameters, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    if dims[0] < 7:  # the columns past dims[0] are not trained
        assert all(g[:, dims[0]:].abs().max() == 0 for g in got_inputs)


def test_truncated_rows_are_what_sentence_transformers_shrink_hands_the_inner_loss():
    pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.losses.matryoshka import (
        shrink as st_shrink,
    )

    inner, dims, weights = ClipLoss(temperature=0.05).double(), (8, 5, 2), (1.0, 0.3, 0.6)
    image, text = CASES_BY_NAME["clip"].inputs(5, 8, seed=2)
    want = sum(w * inner(st_shrink(image, d), st_shrink(text, d)) for d, w in zip(dims, weights))
    torch.testing.assert_close(Matryoshka(inner, dims, weights=weights)(image, text), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiled_equals_dense(case):
    inputs = case.inputs(5, 6)
    weights = (1.0, 0.5, 0.25)
    dense = loss_and_grads(Matryoshka(case.make(None), (6, 3, 1), weights=weights).double(), inputs)
    tiled = loss_and_grads(Matryoshka(case.make(2, column_tile_size=3), (6, 3, 1), weights=weights).double(), inputs)
    torch.testing.assert_close(tiled[0], dense[0], rtol=1e-12, atol=0)
    for t, d in zip(tiled[1] + tiled[2], dense[1] + dense[2]):
        torch.testing.assert_close(t, d, rtol=1e-10, atol=1e-13)


# --- under the strategies --------------------------------------------------------------------------------------
N, WIDTH, CHUNK, DIMS, WEIGHTS = 8, 6, 3, (6, 3, 1), (1.0, 0.5, 2.0)


def setup(name: str, tile_size: int | None, queue_size: int = 0):
    """(modules whose gradients are compared, encoders, Matryoshka loss, inputs, chunk sizes), float64, no dropout."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inner = CASES_BY_NAME[name].make(tile_size=tile_size, queue_size=queue_size)
    loss = Matryoshka(inner, DIMS, weights=WEIGHTS)
    if name == "clip":
        image, text = mlp(out=WIDTH).double().eval(), TokenEncoder(out=WIDTH).double().eval()
        inputs = (torch.randn(N, 10, generator=g, dtype=torch.float64), tokens(N, seed=2))
        return [image, text, loss], [image, text], loss, inputs, CHUNK
    encoder = mlp(out=WIDTH).double().eval()
    inputs = [torch.randn(N, 10, generator=g, dtype=torch.float64) for _ in range(2)]
    hard = CASES_BY_NAME[name].hard_negatives
    if hard:  # chunk k of the negatives pairs with chunk k of the queries (NaiveAccumulation's micro-batches)
        inputs.append(torch.randn(hard * N, 10, generator=g, dtype=torch.float64))
    modules = [encoder, loss] if list(loss.parameters()) else [encoder]
    return modules, encoder, loss, tuple(inputs), ([CHUNK, CHUNK, hard * CHUNK] if hard else CHUNK)




def twin(modules, encoders, loss):
    """Deep copies of (modules, encoders, loss) sharing nothing with the originals, for a reference run."""
    copies = copy.deepcopy(modules if loss in modules else [*modules, loss])
    towers = copies[: len(encoders)] if isinstance(encoders, list) else copies[0]
    return copies[: len(modules)], towers, copies[-1]


@pytest.mark.parametrize("tile_size", [None, 3])
@pytest.mark.parametrize("strategy", [GradCache, CachedLoss])
@pytest.mark.parametrize("name", ["clip", "siglip", "ntxent", "infonce_symmetric_hard"])
def test_gradcache_equals_full_batch_on_every_parameter_and_naive_accumulation_does_not(name, strategy, tile_size):
    modules, encoders, loss, inputs, chunk = setup(name, tile_size)
    want_modules, want_encoders, want_loss = twin(modules, encoders, loss)
    want_value, want = run_strategy(FullBatch, want_modules, want_encoders, want_loss, inputs, None)
    got_value, got = run_strategy(strategy, modules, encoders, loss, inputs, chunk)
    torch.testing.assert_close(got_value, want_value, rtol=1e-10, atol=0)
    assert_grads_close(got, want, 1e-9)
    if loss in modules:  # the inner loss's learnable temperature (and bias) has its own, nonzero gradient
        assert all(v.abs().sum() > 0 for k, v in want.items() if k.startswith(f"{len(modules) - 1}."))

    naive_modules, naive_encoders, naive_loss = twin(modules, encoders, loss)
    _, naive = run_strategy(NaiveAccumulation, naive_modules, naive_encoders, naive_loss, inputs, chunk)
    scale = max(w.abs().max().item() for w in want.values())
    assert max((naive[k] - want[k]).abs().max().item() for k in want) > 1e-3 * scale


QUEUE, STEPS = 6, 3  # fewer rows than one step pushes: the ring wraps


def embed(encoders, inputs):
    towers = encoders if isinstance(encoders, list) else [encoders] * len(inputs)
    with torch.no_grad():
        return [t(**x) if isinstance(x, dict) else t(x) for t, x in zip(towers, inputs)]


def rows_of(value, start: int, stop: int):
    return {k: v[start:stop] for k, v in value.items()} if isinstance(value, dict) else value[start:stop]


def calls_of(strategy, inputs, chunk):
    """The inputs of each call of the loss in one step: the whole batch, or NaiveAccumulation's micro-batches."""
    if strategy is not NaiveAccumulation:
        return [inputs]
    sizes = chunk if isinstance(chunk, list) else [chunk] * len(inputs)
    return [[rows_of(x, k * s, (k + 1) * s) for x, s in zip(inputs, sizes)] for k in range(-(-N // CHUNK))]


@pytest.mark.parametrize("tile_size", [None, 3])
@pytest.mark.parametrize("strategy", [GradCache, CachedLoss, FullBatch, NaiveAccumulation])
@pytest.mark.parametrize("name", ["clip", "infonce_symmetric_hard"])
def test_one_full_width_queue_pushed_once_per_call_equals_a_queue_kept_by_hand(name, strategy, tile_size):
    case = CASES_BY_NAME[name]
    modules, encoders, loss, first_inputs, chunk = setup(name, tile_size, queue_size=QUEUE)
    full_modules, full_encoders, full_loss = twin(modules, encoders, loss)
    by_hand: list[torch.Tensor | None] = [None] * len(queues_of(loss))  # full-width rows, oldest first
    calls = 0
    for step in range(STEPS):
        g = torch.Generator().manual_seed(10 + step)
        inputs = [x if isinstance(x, dict) else torch.randn(x.shape, generator=g, dtype=x.dtype) for x in first_inputs]
        value, grads = run_strategy(strategy, modules, encoders, loss, inputs, chunk)

        values = []  # the reference: per call of the loss, the formula against the hand queue, then one push
        for call_inputs in calls_of(strategy, inputs, chunk):
            embeddings = embed(encoders, call_inputs)
            with torch.no_grad():
                values.append(by_formula(case, loss.loss, embeddings, DIMS, WEIGHTS, by_hand))
            by_hand = [(new if old is None else torch.cat([old, new]))[-QUEUE:]
                       for old, new in zip(by_hand, case.pushed(embeddings))]
            calls += 1
        torch.testing.assert_close(value, torch.stack(values).mean(), rtol=1e-10, atol=0)
        if strategy in (GradCache, CachedLoss):  # and the gradient is FullBatch's from the same queue state
            _, want = run_strategy(FullBatch, full_modules, full_encoders, full_loss, inputs, None)
            assert_grads_close(grads, want, 1e-9)
    for queue, rows in zip(queues_of(loss), by_hand):
        assert queue.rows.shape == (QUEUE, WIDTH)  # full width, not dims[-1]
        assert int(queue.calls) == calls  # once per call of the whole loss, not once per dim
        torch.testing.assert_close(queue.contents(rows), rows, rtol=1e-12, atol=0)


def test_evaluation_under_no_grad_leaves_the_queue_alone():
    modules, encoders, loss, inputs, chunk = setup("clip", None, queue_size=QUEUE)
    run_strategy(GradCache, modules, encoders, loss, inputs, chunk)
    before = {k: v.clone() for k, v in loss.named_buffers()}
    with torch.no_grad():
        GradCache(encoders, loss, chunk).loss(*inputs)
    assert all(torch.equal(v, before[k]) for k, v in loss.named_buffers())


def test_an_error_in_one_dim_leaves_the_queue_as_it_was_and_usable():
    class NarrowFails(InfoNCE):
        def forward(self, query, positive, negatives=None):
            if query.shape[1] < 3:
                raise RuntimeError("this loss needs 3 columns")
            return super().forward(query, positive, negatives)

    inner = NarrowFails(queue_size=QUEUE)
    query, positive = CASES_BY_NAME["infonce"].inputs(4, 6, seed=3)
    Matryoshka(inner, (6, 3))(query, positive)
    before = {k: v.clone() for k, v in inner.named_buffers()}
    with pytest.raises(RuntimeError, match="needs 3 columns"):
        Matryoshka(inner, (6, 2))(query, positive)
    assert all(torch.equal(v, before[k]) for k, v in inner.named_buffers())
    inner(query, positive)  # no longer shared: a plain call pushes again
    assert int(inner.queue.calls) == 2


def test_a_loss_that_pushes_other_tensors_than_its_inputs_is_refused():
    class PushesCopies(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.queue = EmbeddingQueue(4)

        def forward(self, a, b):
            self.queue.contents(a)
            value = (a * b).sum()
            self.queue.push(value, a.clone())
            return value

    with pytest.raises(RuntimeError, match="PushesCopies pushed into its queue a tensor that Matryoshka did not"):
        Matryoshka(PushesCopies(), (4, 2))(torch.randn(3, 4), torch.randn(3, 4))


# --- bad input -------------------------------------------------------------------------------------------------
def test_a_dim_wider_than_the_embedding_raises_before_any_gradient_or_queue_changes():
    modules, encoders, loss, inputs, chunk = setup("infonce_symmetric_hard", None, queue_size=QUEUE)
    run_strategy(GradCache, modules, encoders, loss, inputs, chunk)  # a queue holding rows
    before = {k: v.clone() for k, v in loss.named_buffers()}
    wide = Matryoshka(loss.loss, (8, 4))
    zero(*modules)
    with pytest.raises(ValueError, match=r"dims\[0\]=8 is larger than the embedding width 6 of query.*no larger "
                                         r"than 6"):
        GradCache(encoders, wide, chunk).step(*inputs)
    assert all(p.grad is None for m in modules for p in m.parameters())
    assert all(torch.equal(v, before[k]) for k, v in loss.named_buffers())


@pytest.mark.parametrize("arguments, error, message", [
    (dict(dims=()), ValueError, "dims is empty"),
    (dict(dims=(8, 8, 4)), ValueError, r"strictly decreasing.*dims\[1\]=8 follows dims\[0\]=8.*dims=\(8, 4\)"),
    (dict(dims=(4, 8)), ValueError, r"strictly decreasing.*dims=\(8, 4\)"),
    (dict(dims=(8, 0)), ValueError, r"dims\[1\]=0 must be >= 1"),
    (dict(dims=(8, 4.0)), TypeError, r"dims\[1\] must be an int"),
    (dict(dims=(8, True)), TypeError, r"dims\[1\] must be an int"),
    (dict(dims=8), TypeError, "dims must be a sequence"),
    (dict(dims=(8, 4), weights=(1.0,)), ValueError, "weights has 1 entries but dims has 2"),
    (dict(dims=(8, 4), weights=(1.0, 0.0)), ValueError, r"weights\[1\]=0.0 must be finite and > 0"),
    (dict(dims=(8, 4), weights=(1.0, float("nan"))), ValueError, r"weights\[1\]=nan must be finite"),
    (dict(dims=(8, 4), weights=(1.0, "1")), TypeError, r"weights\[1\] must be a number"),
])
def test_bad_arguments_name_the_argument_the_value_and_the_fix(arguments, error, message):
    with pytest.raises(error, match=message):
        Matryoshka(InfoNCE(), **arguments)


def test_bad_losses_and_arguments_at_forward():
    with pytest.raises(TypeError, match="loss must be an nn.Module"):
        Matryoshka(lambda q, p: q.sum(), (4, 2))
    with pytest.raises(TypeError, match="already a Matryoshka"):
        Matryoshka(Matryoshka(InfoNCE(), (4, 2)), (4,))
    loss = Matryoshka(InfoNCE(), (4, 2))
    with pytest.raises(TypeError, match=r"do not fit InfoNCE.forward.*positive"):
        loss(torch.randn(3, 4))
    with pytest.raises(ValueError, match="positive has width 5 but query has width 4"):
        loss(torch.randn(3, 4), torch.randn(3, 5))
    assert Matryoshka(InfoNCE(), (4, 2))(torch.randn(3, 4), torch.randn(3, 4), None).ndim == 0  # None passes
