"""queue_size: every loss, dense and tiled, against the brute-force formula with the queued rows as extra negatives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss
from gradcache.losses.queue import EmbeddingQueue, QueuePair
from tests.losses import brute_force
from tests.losses.cases import loss_and_grads

QUEUE = 7  # fewer rows than two calls push: the ring wraps


@dataclass(frozen=True)
class QueueCase:
    name: str
    make: Callable[..., torch.nn.Module]  # make(queue_size=, tile_size=, column_tile_size=, queue_warmup=)
    pushed: Callable[[list[torch.Tensor]], list[torch.Tensor]]  # inputs -> the rows each queue receives
    brute: Callable[[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]], torch.Tensor]
    hard_negatives: int = 0

    def inputs(self, n: int, d: int, seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        first = torch.randn(n, d, generator=generator, dtype=torch.float64)
        tensors = [first, 2.0 * (first + 0.7 * torch.randn(n, d, generator=generator, dtype=torch.float64))]
        if self.hard_negatives:
            tensors.append(torch.randn(n * self.hard_negatives, d, generator=generator, dtype=torch.float64))
        return tensors


def _infonce(symmetric: bool, hard_negatives: int) -> QueueCase:
    return QueueCase(
        f"infonce{'_symmetric' if symmetric else ''}{'_hard' if hard_negatives else ''}",
        lambda **kw: InfoNCE(temperature=0.1, symmetric=symmetric, **kw),
        lambda x: [torch.cat(x[1:])],  # one queue of candidates: positives, then hard negatives
        lambda loss, x, queues: brute_force.infonce(x[0], x[1], x[2] if len(x) > 2 else None, 0.1, symmetric,
                                                    queue=queues[0]),
        hard_negatives,
    )


CASES = [
    _infonce(False, 0), _infonce(False, 2), _infonce(True, 1),
    QueueCase("ntxent", lambda **kw: NTXent(temperature=0.5, **kw), lambda x: [torch.cat(x)],
              lambda loss, x, queues: brute_force.ntxent(x[0], x[1], 0.5, queue=queues[0])),
    QueueCase("clip", lambda **kw: ClipLoss(temperature=0.1, **kw).double(), lambda x: [x[0], x[1]],
              lambda loss, x, queues: brute_force.clip(x[0], x[1], loss.logit_scale, *queues)),
    QueueCase("siglip", lambda **kw: SigLipLoss(temperature=0.1, bias=-2.0, **kw).double(),
              lambda x: [x[0], x[1]],
              lambda loss, x, queues: brute_force.siglip(x[0], x[1], loss.logit_scale, loss.bias, *queues)),
]
TILINGS = {"dense": {}, "tiled": dict(tile_size=3, column_tile_size=4), "strips": dict(tile_size=2, column_tile_size=64)}


def _queues(loss: torch.nn.Module) -> list[EmbeddingQueue]:
    return [m for m in loss.modules() if isinstance(m, EmbeddingQueue)]


@pytest.mark.parametrize("tiling", list(TILINGS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_loss_with_queue_matches_formula_with_queued_rows_as_negatives(case, tiling):
    loss = case.make(queue_size=QUEUE, **TILINGS[tiling])
    history: list[list[torch.Tensor]] = []
    for call, n in enumerate([3, 2, 4]):  # the queue: empty, then partly filled, then wrapped
        inputs = case.inputs(n, 5, seed=call)
        expected = None
        if history:  # oldest first: the last QUEUE rows pushed so far, per queue
            expected = [torch.cat(rows)[-QUEUE:] for rows in zip(*history)]
        want_leaves = [t.clone().requires_grad_() for t in inputs]
        parameters = list(loss.parameters())
        want = case.brute(loss, want_leaves, expected or [None] * len(_queues(loss)))
        want_grads = torch.autograd.grad(want, want_leaves + parameters)
        got, got_inputs, got_parameters = loss_and_grads(loss, inputs)
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=0)
        for g, w in zip(got_inputs + got_parameters, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
        history.append(case.pushed(inputs))
        for queue, rows in zip(_queues(loss), zip(*history)):
            like = rows[0]
            torch.testing.assert_close(queue.contents(like), torch.cat(rows)[-QUEUE:], rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nothing_enqueued_under_no_grad_and_queued_rows_get_no_gradient(case):
    loss = case.make(queue_size=QUEUE)
    with torch.no_grad():
        loss(*case.inputs(3, 5, seed=0))
    assert all(int(q.count) == 0 and int(q.calls) == 0 for q in _queues(loss))
    inputs = case.inputs(3, 5, seed=0)
    loss(*inputs)
    assert [int(q.count) for q in _queues(loss)] == [min(len(rows), QUEUE) for rows in case.pushed(inputs)]
    assert all(not q.rows.requires_grad for q in _queues(loss))


def test_nothing_enqueued_for_a_non_finite_loss():
    # t so small that s = 1/t overflows float32 once the loss subtracts a target logit of -s from a max of +s.
    loss = InfoNCE(temperature=3e-39, queue_size=4)
    query = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    positive = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])
    value = loss(query, positive)
    assert not torch.isfinite(value)
    assert int(loss.queue.count) == 0 and int(loss.queue.calls) == 0


def test_warmup_neither_reads_nor_fills_the_queue_for_its_calls():
    loss = NTXent(temperature=0.5, queue_size=16, queue_warmup=2)
    plain = NTXent(temperature=0.5)
    for call in range(4):
        z1, z2 = torch.randn(2, 3, 4, dtype=torch.float64)
        got, want = loss(z1, z2), plain(z1, z2)
        assert torch.equal(got, want) == (call < 3)  # calls 0, 1: warm-up; call 2: an empty queue; call 3: 6 rows
        assert int(loss.queue.count) == 6 * max(0, call - 1)


def test_state_dict_loads_into_a_fresh_loss_and_a_queue_of_size_zero_saves_nothing():
    loss = ClipLoss(queue_size=5, queue_warmup=1)
    for _ in range(3):
        loss(torch.randn(3, 4), torch.randn(3, 4))
    fresh = ClipLoss(queue_size=5, queue_warmup=1)
    fresh.load_state_dict(loss.state_dict())  # strict: the (0, 0) placeholders take the saved (5, 4)
    for name, buffer in loss.named_buffers():
        assert torch.equal(dict(fresh.named_buffers())[name], buffer), name
    image, text = torch.randn(2, 3, 4)
    assert torch.equal(fresh(image, text), loss(image, text))
    with pytest.raises(RuntimeError, match="queue_size=5"):
        ClipLoss(queue_size=6).load_state_dict(loss.state_dict())
    assert set(ClipLoss().state_dict()) == {"logit_scale"}
    assert set(InfoNCE().state_dict()) == set()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_batch_of_another_width_than_the_queue_raises_before_any_state_changes(case):
    loss = case.make(queue_size=QUEUE)
    loss(*case.inputs(3, 5, seed=0))
    before = {name: b.clone() for name, b in loss.named_buffers()}
    with pytest.raises(ValueError, match="queue_size.*width 5.*width 6.*reset"):
        loss(*case.inputs(3, 6, seed=1))
    assert all(torch.equal(b, before[name]) for name, b in loss.named_buffers())
    for queue in _queues(loss):
        queue.reset()
    loss(*case.inputs(3, 6, seed=1))  # after a reset the next call fixes the width again


@pytest.mark.parametrize("make", [InfoNCE, NTXent, ClipLoss, SigLipLoss])
def test_bad_queue_options_name_the_option_and_the_fix(make):
    with pytest.raises(ValueError, match="queue_size must be an int >= 0.*got -1"):
        make(queue_size=-1)
    for bad in (2.5, True, "8"):
        with pytest.raises(TypeError, match="queue_size must be an int"):
            make(queue_size=bad)
    with pytest.raises(ValueError, match="queue_warmup must be an int >= 0"):
        make(queue_size=4, queue_warmup=-2)
    with pytest.raises(ValueError, match="queue_warmup=3 needs a queue: pass queue_size > 0"):
        make(queue_warmup=3)


@pytest.mark.parametrize(("make", "names"), [(ClipLoss, ("image_queue", "text_queue")),
                                             (SigLipLoss, ("a_queue", "b_queue"))])
def test_a_paired_loss_shows_its_two_queues_as_one_pair_named_first_and_second(make, names):
    loss = make(queue_size=4).double()
    first, second = (getattr(loss, name) for name in names)
    assert (loss.queues.first, loss.queues.second) == (first, second)
    x, y = torch.randn(2, 3, 5, dtype=torch.float64)
    assert loss.queues.contents(x, y) == (None, None)  # empty
    loss(x, y)
    queued_x, queued_y = loss.queues.contents(x, y)
    assert torch.equal(queued_x, x) and torch.equal(queued_y, y)
    loss.queues.reset()
    assert int(first.count) == int(second.count) == 0
    assert make().queues.contents(x, y) == (None, None)  # no queue: a pair of None that does nothing
    make().queues.push(torch.tensor(1.0), x, y)


def test_a_queue_pair_holds_two_queues_or_none():
    with pytest.raises(ValueError, match="two queues or none"):
        QueuePair(EmbeddingQueue(4), None)
