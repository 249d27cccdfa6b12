"""The training-side FSDP pieces: block-wise sharding, sharded checkpoints resumed on two ranks and on one
process, CPU offload, and the 8-bit AdamW factory's errors.

The two-rank cases run inside the one spawn of tests/test_fsdp.py (`fsdp_runs`), which calls `train_worker`.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from gradcache import GradCache
from gradcache.losses import ClipLoss
from gradcache.train.checkpoints.sharded import (
    load_sharded,
    save_sharded,
    sharded_extra,
)
from gradcache.train.errors import CheckpointError
from gradcache.train.optim.adamw8bit import adamw_8bit
from gradcache.train.optim.optimizers import build_optimizer, parameter_groups
from gradcache.train.parallel.fsdp import offload_policy, shard_encoder

GLOBAL, CHUNK = 12, 2


def build(seed: int, width: int = 16) -> nn.ModuleDict:
    """Everything trained in one module (two towers and the loss's temperature), as `save_sharded` wants it."""
    torch.manual_seed(seed)
    def tower():
        return nn.Sequential(nn.Linear(10, width), nn.GELU(), nn.Linear(width, 8))
    return nn.ModuleDict(dict(image=tower(), text=tower(), loss=ClipLoss(temperature=0.1, learnable=True)))


def optimizer_for(model: nn.Module) -> torch.optim.Optimizer:
    return build_optimizer("adamw", [model], lr=0.05, weight_decay=0.1)


def train(model: nn.ModuleDict, optimizer, steps, rank: int = 0, world_size: int = 1) -> list[float]:
    """GradCache steps on the global batch of each step, this rank's rows only; returns the (global) losses."""
    strategy = GradCache([model["image"], model["text"]], model["loss"], CHUNK)
    rows = slice(rank * GLOBAL // world_size, (rank + 1) * GLOBAL // world_size)
    losses = []
    for step in steps:
        g = torch.Generator().manual_seed(100 + step)
        images, texts = torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 10, generator=g)
        losses.append(strategy.step(images[rows], texts[rows]).item())
        optimizer.step()
        optimizer.zero_grad()
    return losses


def sharded(seed: int, cpu_offload: bool = False) -> nn.ModuleDict:
    model = build(seed)
    shard_encoder(model["image"], cpu_offload=cpu_offload)
    shard_encoder(model["text"], cpu_offload=cpu_offload)
    return model


def train_worker(rank: int, world_size: int, folder: str) -> dict:
    checkpoint = str(Path(folder) / "step2")
    model = sharded(seed=0)
    optimizer = optimizer_for(model)
    first = train(model, optimizer, [0, 1], rank, world_size)
    save_sharded(checkpoint, model, optimizer, extra={"step": 2})
    continued = train(model, optimizer, [2, 3], rank, world_size)

    fresh = sharded(seed=1)  # other weights: everything must come from the checkpoint
    fresh_optimizer = optimizer_for(fresh)
    extra = load_sharded(checkpoint, fresh, fresh_optimizer)
    resumed = train(fresh, fresh_optimizer, [2, 3], rank, world_size)

    offloaded = sharded(seed=0, cpu_offload=True)
    offloaded_losses = train(offloaded, optimizer_for(offloaded), [0, 1, 2, 3], rank, world_size)
    try:
        adamw_8bit(parameter_groups([model], 0.1), lr=1e-3, device="cpu")
        refusal = None
    except ValueError as error:
        refusal = str(error)
    sharded_units = [type(m).__name__ for m in model["image"]
                     if callable(getattr(m, "set_requires_gradient_sync", None))]
    return {"first": first, "continued": continued, "resumed": resumed, "extra": extra,
            "offloaded": offloaded_losses, "adamw8bit": refusal, "sharded_units": sharded_units}


@pytest.fixture(scope="module")
def runs():
    from tests.test_fsdp import fsdp_runs

    ranks, folder = fsdp_runs()
    return [r["train"] for r in ranks], folder


@pytest.mark.slow
def test_every_block_is_sharded(runs):
    """The Linear layers of the Sequential are units of their own; the GELU (no parameters) is not."""
    assert runs[0][0]["sharded_units"] == ["FSDPLinear", "FSDPLinear"]


@pytest.mark.slow
def test_two_ranks_resume_a_sharded_checkpoint_with_the_same_losses(runs):
    for result in runs[0]:
        assert result["extra"] == {"step": 2, "world_size": 2}
        assert result["resumed"] == pytest.approx(result["continued"], rel=1e-6)
        assert result["continued"] != pytest.approx(result["first"], rel=1e-3)  # training moved on


@pytest.mark.slow
def test_one_process_resumes_what_two_ranks_saved(runs):
    """A different number of ranks: one process, unsharded modules, the global batch, the same losses."""
    results, folder = runs
    model = build(seed=1)
    optimizer = optimizer_for(model)
    extra = load_sharded(Path(folder) / "step2", model, optimizer)
    assert extra["world_size"] == 2
    assert train(model, optimizer, [2, 3]) == pytest.approx(results[0]["continued"], rel=1e-5)


@pytest.mark.slow
def test_cpu_offload_trains_like_no_offload(runs):
    for result in runs[0]:
        assert result["offloaded"] == pytest.approx(result["first"] + result["continued"], rel=1e-5)


@pytest.mark.slow
def test_a_checkpoint_of_another_model_or_no_checkpoint_is_refused(runs, tmp_path):
    _, folder = runs
    other = nn.ModuleDict(dict(projection=nn.Linear(2, 2), **build(seed=0)))  # one module the checkpoint lacks
    with pytest.raises(CheckpointError, match=r"\['projection.bias', 'projection.weight'\].*another model"):
        load_sharded(Path(folder) / "step2", other, optimizer_for(other))
    model = build(seed=0)
    with pytest.raises(CheckpointError, match="not a sharded"):
        load_sharded(tmp_path, model, optimizer_for(model))
    (tmp_path / "last.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="single-file checkpoint"):
        load_sharded(tmp_path / "last.pt", model, optimizer_for(model))


def test_a_save_replaces_the_previous_checkpoint_whole(tmp_path):
    """One process, no process group: a second save over the first keeps it as `previous`, and a crashed save's
    leftovers are ignored (the choice between the two is gradcache.train.checkpoints.run_checkpoint's, tested there)."""
    folder, previous = tmp_path / "last", tmp_path / "previous"
    model = build(seed=0)
    optimizer = optimizer_for(model)
    train(model, optimizer, [0])
    save_sharded(folder, model, optimizer, extra={"step": 1}, previous=previous)
    (tmp_path / "last.partial").mkdir()  # as a crash in the middle of the next save leaves it
    train(model, optimizer, [1])
    save_sharded(folder, model, optimizer, extra={"step": 2}, previous=previous)
    assert sharded_extra(folder) == {"step": 2, "world_size": 1}
    assert sharded_extra(previous) == {"step": 1, "world_size": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "previous"]
    fresh = build(seed=1)
    fresh_optimizer = optimizer_for(fresh)
    assert load_sharded(folder, fresh, fresh_optimizer)["step"] == 2
    assert train(fresh, fresh_optimizer, [2]) == pytest.approx(train(model, optimizer, [2]), rel=1e-6)


@pytest.mark.parametrize("failing_call", [1, 2, 3, 4])
def test_a_failed_rename_leaves_both_sharded_checkpoints_as_they_were(tmp_path, monkeypatch, failing_call):
    """The four renames of a save over two checkpoints (extra.pt into the partial folder, the older previous
    aside, last to previous, the new folder to last) fail one at a time: last and previous hold what they held,
    and no partial folder is left."""
    import os

    from gradcache.train.checkpoints import atomic

    folder, previous = tmp_path / "last", tmp_path / "previous"
    model = build(seed=0)
    optimizer = optimizer_for(model)
    for step in (1, 2):
        save_sharded(folder, model, optimizer, extra={"step": step}, previous=previous)
    real_replace, calls = os.replace, []

    def replace(source, target):
        calls.append((source, target))
        if len(calls) == failing_call:
            raise OSError(5, "Input/output error")
        real_replace(source, target)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        save_sharded(folder, model, optimizer, extra={"step": 3}, previous=previous)
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    assert len(calls) >= failing_call  # the undoing renames come after the failed one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "previous"]
    assert sharded_extra(folder)["step"] == 2 and sharded_extra(previous)["step"] == 1


def test_sharding_needs_a_process_group():
    with pytest.raises(ValueError, match="torchrun"):
        shard_encoder(nn.Linear(2, 2))


def test_cpu_offload_policy_pins_memory_only_for_cuda():
    assert offload_policy(True, "cpu").pin_memory is False
    assert offload_policy(True, "cuda").pin_memory is True
    assert type(offload_policy(False, "cpu")).__name__ == "OffloadPolicy"


@pytest.mark.slow
def test_8bit_adamw_refuses_fsdp_sharded_parameters(runs):
    message = runs[0][0]["adamw8bit"]
    assert message is not None and "DTensor" in message and "--optimizer adamw" in message


def test_8bit_adamw_without_bitsandbytes_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        adamw_8bit(parameter_groups([nn.Linear(2, 2)], 0.1), lr=1e-3, device="cpu")


def _fake_bitsandbytes(step):
    optimizer = type("AdamW8bit", (torch.optim.SGD,), {"step": step})
    return types.SimpleNamespace(__version__="0.0-test", optim=types.SimpleNamespace(AdamW8bit=optimizer))


def test_8bit_adamw_names_the_unsupported_device(monkeypatch):
    def no_kernel(self, closure=None):
        raise NotImplementedError("no 8-bit kernel here")

    monkeypatch.setitem(sys.modules, "bitsandbytes", _fake_bitsandbytes(no_kernel))
    with pytest.raises(RuntimeError, match="no 8-bit AdamW for device 'cpu'.*CUDA GPU.*--optimizer adamw"):
        adamw_8bit(parameter_groups([nn.Linear(2, 2)], 0.1), lr=1e-3, device="cpu")


def test_8bit_adamw_gets_the_groups_without_their_lars_flag(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", _fake_bitsandbytes(torch.optim.SGD.step))
    layer = nn.Linear(2, 2)
    optimizer = adamw_8bit(parameter_groups([layer], 0.1), lr=1e-3)  # the parameters' device
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert all("adapt" not in g for g in optimizer.param_groups)
