"""LossBase: each loss's negatives_per_anchor against a brute-force count of the logits it builds, the repr built from
its declared hyperparameters, and the attribute, parameter and state_dict names every loss kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

import gradcache
from gradcache.losses import ClipLoss, InfoNCE, Matryoshka, NTXent, SigLipLoss
from gradcache.losses.base import LossBase


class _Softmaxes(TorchFunctionMode):
    """Records each (logits, positive column) a loss scores: the inputs of F.cross_entropy, and for SigLIP's
    pairwise sigmoid the (N_a, N_b) input of F.logsigmoid, whose diagonal holds the positive pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.cross_entropy:
            self.calls.append((args[0].detach(), args[1]))
        elif func is F.logsigmoid:
            self.calls.append((args[0].detach(), torch.arange(args[0].shape[0])))
        return func(*args, **(kwargs or {}))


def _counted_negatives(logits: torch.Tensor, target: torch.Tensor) -> list[int]:
    """Per row: the finite entries other than the positive pair's, recognised by value (a block that repeats the
    pair, as doc_to_query's diagonal does, repeats its value exactly; random float64 rows tie nowhere else)."""
    positive = logits.gather(1, target[:, None])  # (rows, 1)
    return (torch.isfinite(logits) & (logits != positive)).sum(1).tolist()


def _inputs(n: int, hard_negatives: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(n + 10 * hard_negatives)
    rows = [n, n] + ([n * hard_negatives] if hard_negatives else [])
    return [torch.randn(count, 6, generator=generator, dtype=torch.float64) for count in rows]


ALL_DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc", "positive_to_positive")
JOINT = [("query_to_doc",), ("query_to_doc", "query_to_query"), ("query_to_doc", "doc_to_query"),
         ("query_to_doc", "doc_to_doc"), ("query_to_doc", "positive_to_positive"), ALL_DIRECTIONS]
LOSSES = {  # name -> (loss, h): one softmax (or pair block) per anchor row, or more where noted
    "ntxent": (NTXent, 0), "clip": (ClipLoss, 0), "siglip": (SigLipLoss, 0), "infonce": (InfoNCE, 0),
    "infonce_hard": (InfoNCE, 2),
    **{f"infonce_joint_{'+'.join(d[1:]) or 'default'}_hard": (lambda d=d: InfoNCE(directions=d), 2) for d in JOINT},
    "infonce_all_dot": (lambda: InfoNCE(directions=ALL_DIRECTIONS, similarity="dot"), 1),
    "matryoshka_infonce_all": (lambda: Matryoshka(InfoNCE(directions=ALL_DIRECTIONS), dims=(6, 3)), 1),
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("n", [1, 5])
def test_negatives_per_anchor_counts_the_logits_of_the_loss(name, n):
    make, hard_negatives = LOSSES[name]
    loss_fn = make()
    recorder = _Softmaxes()
    with recorder:
        loss_fn(*_inputs(n, hard_negatives))
    counts = {count for logits, target in recorder.calls for count in _counted_negatives(logits, target)}
    assert recorder.calls and counts == {loss_fn.negatives_per_anchor(n, hard_negatives)}


@pytest.mark.parametrize("hard_negatives", [0, 1, 3])
def test_per_direction_counts_the_query_softmax_and_documents_the_positive_one(hard_negatives):
    """symmetric: query i's softmax (query_to_doc) holds n(1 + h) - 1 negatives, the count; positive i's n - 1."""
    n = 4
    loss_fn = InfoNCE(symmetric=True)
    recorder = _Softmaxes()
    with recorder:
        loss_fn(*_inputs(n, hard_negatives))
    query_softmax, positive_softmax = recorder.calls
    assert set(_counted_negatives(*query_softmax)) == {loss_fn.negatives_per_anchor(n, hard_negatives)}
    assert set(_counted_negatives(*positive_softmax)) == {n - 1}


def test_gradcache_negatives_per_anchor_dispatches_to_the_instance():
    """An instance counts with its own options; a name or a class with the defaults; the queue is added on top."""
    loss_fn = InfoNCE(directions=("query_to_doc", "query_to_query"), queue_size=7)
    assert gradcache.negatives_per_anchor("full", loss_fn, 12, 4, hard_negatives=1, queue_size=7) == \
        loss_fn.negatives_per_anchor(12, 1) + 7 == (24 - 1) + (12 - 1) + 7
    assert gradcache.negatives_per_anchor("full", "infonce", 12, 4, hard_negatives=1) == \
        gradcache.negatives_per_anchor("full", InfoNCE, 12, 4, hard_negatives=1) == 24 - 1
    wrapped = Matryoshka(loss_fn, dims=(4, 2))
    assert gradcache.negatives_per_anchor("naive", wrapped, 12, 4, hard_negatives=1) == \
        loss_fn.negatives_per_anchor(4, 1)


class _Unit(LossBase):
    """A loss of one's own: LossBase gives it the options, repr and gradcache.negatives_per_anchor's dispatch."""

    hyperparameters = ("temperature", "queue_size")

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        return 3 * seen

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum() / self.temperature


def test_a_subclass_of_the_base_is_counted_and_one_without_a_count_cannot_be_built():
    unit = _Unit(0.25, tile_size=None, column_tile_size=None, queue_size=2, queue_warmup=0)
    assert repr(unit) == ("_Unit(\n  temperature=0.25, queue_size=2\n"
                          "  (queue): EmbeddingQueue(size=2, warmup=0, filled=0)\n)")
    assert gradcache.negatives_per_anchor("gradcache", unit, 8, 2, queue_size=2) == 3 * 8 + 2

    class Uncounted(LossBase):
        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return a.sum()

    with pytest.raises(TypeError, match="negatives_per_anchor"):
        Uncounted(0.1, tile_size=None, column_tile_size=None, queue_size=0, queue_warmup=0)


@pytest.mark.parametrize("loss_fn", [NTXent(), ClipLoss(), SigLipLoss(), InfoNCE()], ids=type)
@pytest.mark.parametrize(("seen", "hard_negatives", "message"), [
    (0, 0, "seen must be an int >= 1"), (2.0, 0, "seen must be an int >= 1"), (True, 0, "seen"),
    (4, -1, "hard_negatives must be an int >= 0"), (4, 1.0, "hard_negatives must be an int >= 0"),
])
def test_bad_counts_name_the_argument(loss_fn, seen, hard_negatives, message):
    with pytest.raises(ValueError, match=message):
        loss_fn.negatives_per_anchor(seen, hard_negatives)


@pytest.mark.parametrize("loss_class", [NTXent, ClipLoss, SigLipLoss])
def test_hard_negatives_need_infonce(loss_class):
    with pytest.raises(ValueError, match=rf"hard_negatives=2 needs loss 'infonce'; {loss_class.__name__} takes none"):
        loss_class().negatives_per_anchor(4, 2)
    with pytest.raises(ValueError, match="needs loss 'infonce'"):
        Matryoshka(loss_class(), dims=(4,)).negatives_per_anchor(4, 2)


def test_matryoshka_over_a_loss_without_a_count_names_it():
    class Plain(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a * b).sum()

    with pytest.raises(TypeError, match="inner loss Plain has no negatives_per_anchor"):
        Matryoshka(Plain(), dims=(2,)).negatives_per_anchor(4)


def test_extra_repr_lists_the_declared_hyperparameters_in_order():
    assert NTXent(0.2, tile_size=4, column_tile_size=8, queue_size=3).extra_repr() == \
        "temperature=0.2, tile_size=4, column_tile_size=8, queue_size=3"
    assert ClipLoss(0.05, learnable=False).extra_repr() == \
        "temperature=0.05, learnable=False, tile_size=None, column_tile_size=None, queue_size=0"
    assert SigLipLoss(0.1, bias=-2.5, tile_size=2).extra_repr() == \
        "temperature=0.1, bias=-2.5, learnable=True, tile_size=2, column_tile_size=None, queue_size=0"
    infonce = InfoNCE(0.07, directions=("query_to_query", "query_to_doc"), similarity="dot",
                      hardness_mode="all_negatives", hardness_strength=2.0, margin_strategy="relative", margin=0.1)
    assert infonce.extra_repr() == (
        "temperature=0.07, directions=('query_to_doc', 'query_to_query'), partition_mode='joint', "
        "similarity='dot', hardness_mode='all_negatives', hardness_strength=2.0, margin_strategy='relative', "
        "margin=0.1, tile_size=None, column_tile_size=None, queue_size=0")


def test_extra_repr_follows_a_learned_temperature_to_four_digits():
    loss_fn = SigLipLoss(temperature=0.1, bias=-10.0)
    with torch.no_grad():
        loss_fn.logit_scale.fill_(torch.log(torch.tensor(1 / 0.0123456)))
        loss_fn.bias.fill_(-3.14159)
    assert loss_fn.extra_repr().startswith("temperature=0.01235, bias=-3.142, learnable=True")


QUEUE_BUFFERS = ("rows", "pointer", "count", "calls")


@pytest.mark.parametrize(("make", "parameters", "buffers"), [
    (lambda: NTXent(queue_size=3), [], [f"queue.{b}" for b in QUEUE_BUFFERS]),
    (lambda: InfoNCE(), [], []),
    (lambda: ClipLoss(), ["logit_scale"], []),
    (lambda: ClipLoss(learnable=False, queue_size=2), [],
     ["logit_scale"] + [f"{q}.{b}" for q in ("image_queue", "text_queue") for b in QUEUE_BUFFERS]),
    (lambda: SigLipLoss(), ["logit_scale", "bias"], []),
    (lambda: SigLipLoss(learnable=False, queue_size=2), [],
     ["logit_scale", "bias"] + [f"{q}.{b}" for q in ("a_queue", "b_queue") for b in QUEUE_BUFFERS]),
])
def test_parameters_buffers_and_state_dict_keys_are_the_losses_own(make, parameters, buffers):
    loss_fn = make()
    assert [name for name, _ in loss_fn.named_parameters()] == parameters
    assert [name for name, _ in loss_fn.named_buffers()] == buffers
    assert list(loss_fn.state_dict()) == parameters + buffers


@pytest.mark.parametrize(("loss_fn", "temperature"), [(NTXent(0.3), 0.3), (InfoNCE(0.02), 0.02),
                                                      (ClipLoss(0.07), 0.07), (SigLipLoss(0.5), 0.5)])
def test_temperature_reads_as_given(loss_fn, temperature):
    assert loss_fn.temperature == pytest.approx(temperature, rel=1e-6)
    assert ("learnable" in vars(loss_fn)) == isinstance(loss_fn, (ClipLoss, SigLipLoss))
