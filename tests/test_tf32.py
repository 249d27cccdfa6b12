"""TF32 on CUDA, without a GPU (issue 39 item 1): torch's flags are process state on every build, and an encoder
whose parameters report `cuda` stands in for one on a GPU. Setting TF32 through torch's current API
(`torch.backends.cuda.matmul.fp32_precision = "tf32"`) made building the recompute check raise torch's "mix of the
legacy and new APIs"; the tolerance is loosened only where TF32 is really on for the encoder (matmuls, or cuDNN
for an encoder holding a convolution or an RNN), and the losses' float32 matmuls run without TF32, the flags as
the user set them afterwards."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gradcache import tf32
from gradcache.losses import ClipLoss, InfoNCE
from gradcache.losses.precision import full_precision
from gradcache.recompute_check import TF32_TOLERANCE, TOLERANCES, RecomputeCheck

backends = torch.backends
CURRENT = [(backends, "fp32_precision"), (backends.cuda.matmul, "fp32_precision"), (backends.cudnn, "fp32_precision"),
           (backends.cudnn.conv, "fp32_precision"), (backends.cudnn.rnn, "fp32_precision")]


@pytest.fixture(autouse=True)
def flags_restored():
    """The process's TF32 flags as they were: the legacy ones first (their setters write both APIs' records), then
    the current API's; the legacy getters must read again after (they raise where the two records disagree)."""
    legacy = torch.get_float32_matmul_precision(), backends.cudnn.allow_tf32
    before = [getattr(owner, name) for owner, name in CURRENT]
    yield
    torch.set_float32_matmul_precision(legacy[0])
    backends.cudnn.allow_tf32 = legacy[1]
    for (owner, name), value in zip(CURRENT, before):
        setattr(owner, name, value)
    assert (torch.get_float32_matmul_precision(), backends.cudnn.allow_tf32) == legacy


class OnCuda(nn.Module):
    """`inner`'s modules, with parameters that report cuda:0 (a GPU encoder as the check sees it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def parameters(self, recurse: bool = True):
        return iter([SimpleNamespace(dtype=torch.float32, device=torch.device("cuda", 0),
                                     is_floating_point=lambda: True)])


LINEAR = OnCuda(nn.Linear(4, 4))
CONVOLUTION = OnCuda(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()))
RECURRENT = OnCuda(nn.GRU(4, 4))


def _tolerance(encoder: nn.Module) -> float:
    return RecomputeCheck.for_encoder(encoder, True).tolerance


def test_tf32_set_by_the_current_api_builds_the_check_with_the_tf32_tolerance():
    backends.cuda.matmul.fp32_precision = "tf32"
    assert _tolerance(LINEAR) == TF32_TOLERANCE
    assert RecomputeCheck.for_encoder(LINEAR, True).tf32


def test_the_legacy_api_is_read_too():
    torch.set_float32_matmul_precision("high")  # legacy: TF32 matmuls
    assert _tolerance(LINEAR) == TF32_TOLERANCE
    torch.set_float32_matmul_precision("highest")
    assert _tolerance(LINEAR) == TOLERANCES[torch.float32]


def test_cudnn_tf32_loosens_the_check_only_for_encoders_cudnn_runs():
    """cuDNN's TF32 is on by default: a convolution or an RNN may run in it, a transformer's matmuls do not."""
    assert not tf32.tf32_enabled("matmul") and tf32.tf32_enabled("conv")  # torch's defaults
    assert _tolerance(LINEAR) == TOLERANCES[torch.float32]
    assert _tolerance(CONVOLUTION) == TF32_TOLERANCE and _tolerance(RECURRENT) == TF32_TOLERANCE
    backends.cudnn.conv.fp32_precision = "ieee"
    assert _tolerance(CONVOLUTION) == TOLERANCES[torch.float32] and _tolerance(RECURRENT) == TF32_TOLERANCE


def test_cpu_encoders_keep_the_float32_tolerance_with_tf32_on():
    backends.cuda.matmul.fp32_precision = "tf32"
    assert _tolerance(nn.Linear(4, 4)) == TOLERANCES[torch.float32]


@pytest.mark.parametrize("api", ["current", "legacy"])
def test_the_losses_matmuls_run_without_tf32_and_the_flags_come_back(api):
    if api == "current":
        backends.cuda.matmul.fp32_precision = "tf32"
    else:
        backends.cuda.matmul.allow_tf32 = True
    seen = []
    with full_precision(torch.device("cuda")):
        seen.append(tf32.tf32_enabled("matmul"))
    assert seen == [False] and tf32.tf32_enabled("matmul")
    if api == "legacy":
        assert backends.cuda.matmul.allow_tf32  # still readable the legacy way: no mix of the two APIs
    else:
        assert backends.cuda.matmul.fp32_precision == "tf32"


def test_a_loss_on_cuda_reads_the_flags_off_inside(monkeypatch):
    """The losses enter full_precision around their matmuls: seen through a matmul inside ClipLoss and InfoNCE,
    with the device reported as CUDA (the tensors stay on the CPU)."""
    backends.cuda.matmul.fp32_precision = "tf32"
    inside = []
    original = full_precision

    def on_cuda(device):
        return original(torch.device("cuda"))

    import gradcache.losses.clip as clip_module
    import gradcache.losses.infonce as infonce_module

    monkeypatch.setattr(clip_module, "full_precision", on_cuda)
    monkeypatch.setattr(infonce_module, "full_precision", on_cuda)
    real_matmul = torch.Tensor.__matmul__

    def watched(self, other):
        inside.append(tf32.tf32_enabled("matmul"))
        return real_matmul(self, other)

    monkeypatch.setattr(torch.Tensor, "__matmul__", watched)
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    for loss in (ClipLoss(), InfoNCE()):
        inside.clear()
        loss(x, y)
        assert inside and not any(inside), type(loss).__name__
    monkeypatch.undo()
    assert tf32.tf32_enabled("matmul")


def test_no_flag_is_touched_where_tf32_is_off(monkeypatch):
    writes = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: writes.append(value))
    with full_precision(torch.device("cuda")):
        pass
    assert writes == [] and backends.cuda.matmul.fp32_precision in ("none", "ieee")


def test_an_unknown_operation_names_the_choices():
    with pytest.raises(ValueError, match="operation='attention'.*conv"):
        tf32.tf32_enabled("attention")
