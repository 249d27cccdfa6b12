"""gradcache.negatives_per_anchor against the logits each loss builds inside each strategy: per anchor row, the
finite entries (the self-pair of NT-Xent is masked to -inf) minus its one positive."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import gradcache
from gradcache import FullBatch, GradCache, NaiveAccumulation, losses
from tests.multiprocess import run_on_ranks

LOGIT_OPS = {torch.matmul, torch.mm, torch.Tensor.__matmul__, torch.Tensor.matmul, torch.Tensor.mm,
             torch.Tensor.masked_fill}


class _LastLogits(TorchFunctionMode):
    """Records the last (rows, candidates) matrix a loss builds by a product or a mask: its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.last: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in LOGIT_OPS and isinstance(out, torch.Tensor) and out.ndim == 2:
            self.last = out.detach()
        return out


def _counted(loss_fn: nn.Module, counts: list[int]):
    """`loss_fn`, appending to `counts` the negatives per anchor of the logits of every call."""

    def call(*embeddings):
        recorder = _LastLogits()
        with recorder:
            value = loss_fn(*embeddings)
        finite = torch.isfinite(recorder.last).sum(1)  # (rows,)
        assert len(set(finite.tolist())) == 1, "every anchor sees the same candidates"
        counts.append(int(finite[0]) - 1)  # all but the positive
        return value

    return call


LOSSES = {"ntxent": lambda: losses.NTXent(), "clip": lambda: losses.ClipLoss(),
          "siglip": lambda: losses.SigLipLoss(), "infonce": lambda: losses.InfoNCE()}
STRATEGIES = {"gradcache": GradCache, "full": FullBatch, "naive": NaiveAccumulation}


def _step(strategy: str, loss: str, batch: int, chunk: int, hard: int, counts: list[int], loss_fn=None,
          steps: int = 1) -> None:
    torch.manual_seed(0)
    encoder = nn.Linear(6, 5)
    chunks = [chunk, chunk] + ([chunk * hard] if hard else [])  # naive: micro-batch k takes chunk k of each input
    runner = STRATEGIES[strategy](encoder, _counted(loss_fn or LOSSES[loss](), counts), chunks)
    for _ in range(steps):
        runner.step(*[torch.randn(batch, 6), torch.randn(batch, 6)] + ([torch.randn(batch * hard, 6)] if hard else []))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(("loss", "hard"), [("ntxent", 0), ("clip", 0), ("siglip", 0), ("infonce", 0),
                                            ("infonce", 2)])
def test_counts_match_the_logits_of_the_loss(strategy, loss, hard):
    counts: list[int] = []
    _step(strategy, loss, 12, 4, hard, counts)
    assert counts and set(counts) == {gradcache.negatives_per_anchor(strategy, loss, 12, 4, 1, hard)}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(("loss", "hard"), [("ntxent", 0), ("clip", 0), ("infonce", 0), ("infonce", 2)])
def test_a_full_queue_adds_its_rows_to_every_anchor(strategy, loss, hard):
    counts: list[int] = []
    queued = {"ntxent": losses.NTXent, "clip": losses.ClipLoss, "infonce": losses.InfoNCE}[loss](queue_size=9)
    _step(strategy, loss, 12, 4, hard, counts, loss_fn=queued, steps=3)  # 24 rows or more enqueued: full
    assert counts[-1] == gradcache.negatives_per_anchor(strategy, loss, 12, 4, 1, hard, queue_size=9)
    assert counts[0] == gradcache.negatives_per_anchor(strategy, loss, 12, 4, 1, hard)  # the empty queue


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_matryoshka_loss_counts_as_its_inner_loss(strategy):
    """Every dim's logits (the last recorded: the narrowest) hold the inner loss's count, queue included."""
    counts: list[int] = []
    wrapped = losses.Matryoshka(losses.InfoNCE(queue_size=9), dims=(5, 3, 1))
    _step(strategy, "infonce", 12, 4, 2, counts, loss_fn=wrapped, steps=3)
    assert counts[-1] == gradcache.negatives_per_anchor(strategy, wrapped, 12, 4, 1, 2, queue_size=9)
    assert counts[0] == gradcache.negatives_per_anchor(strategy, wrapped, 12, 4, 1, 2)


def test_the_trainer_default_under_accumulation():
    """`gradcache train --strategy naive` at batch 128, chunk 32: 62 negatives per anchor, not 254."""
    counts: list[int] = []
    _step("naive", "ntxent", 128, 32, 0, counts)
    assert set(counts) == {62} == {gradcache.negatives_per_anchor("naive", "ntxent", 128, 32)}
    assert gradcache.negatives_per_anchor(GradCache, losses.NTXent(), 128, 32) == 254


def _on_rank(rank: int, world_size: int, strategy: str) -> list[int]:
    counts: list[int] = []
    _step(strategy, "ntxent", 4, 2, 0, counts)  # 4 per rank, gathered: a global batch of 8
    return counts


@pytest.mark.parametrize("strategy", ["gradcache", "naive"])
def test_ranks_share_the_batch_and_each_micro_batch(strategy):
    expected = gradcache.negatives_per_anchor(strategy, "ntxent", batch_size=8, chunk_size=2, world_size=2)
    assert run_on_ranks(_on_rank, 2, strategy) == [[expected] * (1 if strategy == "gradcache" else 2)] * 2


@pytest.mark.parametrize(("arguments", "message"), [
    (("magic", "ntxent", 8, 2), "strategy='magic'"),
    (("naive", "triplet", 8, 2), "loss='triplet'"),
    (("naive", "ntxent", 0, 2), "batch_size"),
    (("naive", "ntxent", 8, 0), "chunk_size"),
    (("naive", "ntxent", 9, 2, 2), "not shared evenly"),
    (("naive", "clip", 8, 2, 1, 3), "needs loss 'infonce'"),
    (("naive", "clip", 8, 2, 1, 0, -1), "queue_size must be an int >= 0"),
])
def test_bad_arguments_name_the_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        gradcache.negatives_per_anchor(*arguments)
