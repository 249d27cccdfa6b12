"""Phase (3) compares each re-encoded chunk with its cached embedding and raises before that chunk's backward;
a failed step leaves no partial gradient where .grad was None; check_recompute turns it off or sets the tolerance."""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from gradcache import (
    CachedLoss, GradCache, NonFiniteError, NonFiniteRecomputationError, RecomputationMismatchError,
)
from gradcache.losses import ClipLoss, NTXent
from tests.conftest import mlp


class Counting(nn.Module):
    """An MLP whose output changes from its `drift_from`-th call on: state changed between the passes."""

    def __init__(self, drift_from: int, drift: float = 0.5) -> None:
        super().__init__()
        self.net, self.calls, self.drift_from, self.drift = mlp(), 0, drift_from, drift

    def forward(self, x):
        self.calls += 1
        out = self.net(x)
        return out + self.drift if self.calls >= self.drift_from else out


class NanOnRecompute(Counting):
    def forward(self, x):
        out = super().forward(x)
        return out * float("nan") if self.calls >= self.drift_from else out


class PythonRandom(nn.Module):
    """Noise from Python's random module, which the replay of torch's generators does not cover."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(x) * (1 + random.random())


def clip_step(text_tower, kind="step", **options):
    """A CLIP step of 9 rows in chunks of 3: the image tower's three chunks run (3) first and write .grad,
    then the text tower's; returns the modules for the caller to inspect."""
    torch.manual_seed(0)
    image, loss = mlp(), ClipLoss(learnable=True)
    batch = torch.randn(9, 10), torch.randn(9, 10)
    if kind == "step":
        GradCache([image, text_tower], loss, 3, **options).step(*batch)
    else:
        CachedLoss([image, text_tower], loss, 3, **options)(*batch).backward()
    return image, text_tower, loss


def all_none(*modules):
    return all(p.grad is None for m in modules for p in m.parameters())


@pytest.mark.parametrize("kind", ["step", "cached"])
def test_state_changed_between_passes_raises_and_leaves_no_partial_gradient(kind):
    text = Counting(drift_from=5)  # phase (1): calls 1-3; phase (3): chunk 1 matches (call 4), chunk 2 drifts
    with pytest.raises(RecomputationMismatchError) as raised:
        clip_step(text, kind)
    message = str(raised.value)
    for part in ("chunk 2 of 3 of input 1", "max |difference|", "tolerance 0.0001", "randomness the replay does not "
                 "cover", "state changed between the passes", "nondeterministic kernels", "check_recompute=False"):
        assert part in message, part
    assert text.calls == 5  # chunk 3 was never re-encoded
    assert all_none(text)  # the image tower's chunks and chunk 1 had written .grad: cleared again


def test_no_gradient_is_written_by_the_failing_step_on_any_parameter():
    torch.manual_seed(0)
    image, text, loss = mlp(), Counting(drift_from=5), ClipLoss(learnable=True)
    with pytest.raises(RecomputationMismatchError):
        GradCache([image, text], loss, 3).step(torch.randn(9, 10), torch.randn(9, 10))
    assert all_none(image, text, loss)  # the loss's own temperature included


def test_uncovered_python_randomness_raises_on_the_first_re_encoded_chunk():
    random.seed(0)
    with pytest.raises(RecomputationMismatchError, match="chunk 1 of 3 of input 1"):
        clip_step(PythonRandom())


def test_weights_changed_between_the_loss_and_its_backward_are_caught():
    torch.manual_seed(0)
    encoder = mlp()
    loss = CachedLoss(encoder, NTXent(), 4)(torch.randn(8, 10), torch.randn(8, 10))
    with torch.no_grad():
        encoder[0].weight.mul_(1.01)  # an optimizer step between the forward and the backward
    with pytest.raises(RecomputationMismatchError, match="chunk 1 of 2 of input 0"):
        loss.backward()
    assert all_none(encoder)


@pytest.mark.parametrize("kind", ["step", "cached"])
def test_nan_only_on_recomputation_raises_the_non_finite_error(kind):
    text = NanOnRecompute(drift_from=6)
    with pytest.raises(NonFiniteRecomputationError, match="chunk 3 of 3 of input 1 and got 18 NaN/inf") as raised:
        clip_step(text, kind)
    assert isinstance(raised.value, NonFiniteError)
    assert all_none(text)


def test_the_option_turns_the_check_off_or_sets_the_tolerance():
    clip_step(Counting(drift_from=5), check_recompute=False)  # known nondeterministic: no error
    clip_step(Counting(drift_from=5, drift=1e-3), check_recompute=0.5)  # drift within the given tolerance
    with pytest.raises(RecomputationMismatchError, match=r"tolerance 1e-09 of it \(check_recompute\)"):
        clip_step(Counting(drift_from=5, drift=1e-6), check_recompute=1e-9)


@pytest.mark.parametrize("value, error", [("yes", TypeError), (None, TypeError), (0, ValueError),
                                          (-0.1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError)])
def test_bad_check_recompute_values_are_refused(value, error):
    with pytest.raises(error, match="check_recompute"):
        GradCache(mlp(), NTXent(), 4, check_recompute=value)


def batchnorm_tower():
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 6))


@pytest.mark.filterwarnings("ignore:An encoder has BatchNorm")
@pytest.mark.parametrize("case", ["dropout", "batchnorm", "bf16", "fp16-autocast", "bf16-weights", "float64"])
def test_a_correct_encoder_never_trips_the_check(case):
    """Replayed dropout, train-mode BatchNorm, autocast and half-precision weights repeat their first pass."""
    torch.manual_seed(0)
    encoder = {"dropout": lambda: mlp(dropout=0.5), "batchnorm": batchnorm_tower}.get(case, mlp)().train()
    options, dtype = {}, torch.float32
    if case in ("bf16", "fp16-autocast"):
        options["autocast_dtype"] = torch.bfloat16 if case == "bf16" else torch.float16
    elif case == "bf16-weights":
        encoder, dtype = encoder.bfloat16(), torch.bfloat16
    elif case == "float64":
        encoder, dtype = encoder.double(), torch.float64
    for cls in (GradCache, CachedLoss):
        for budget in (None, 1500):  # kept graphs are not recomputed, the others still are
            strategy = cls(encoder, NTXent(), 3, memory_budget=budget, **options)
            x, y = torch.randn(8, 10, dtype=dtype), torch.randn(8, 10, dtype=dtype)
            if cls is CachedLoss:
                strategy(x, y).backward()
            else:
                strategy.step(x, y)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in encoder.parameters())
