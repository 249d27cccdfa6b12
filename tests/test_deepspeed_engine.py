"""check_deepspeed_engine: each DeepSpeed config that cannot be exact is refused when the strategy is built, naming
its key, with no process group and no deepspeed installed: a stand-in engine answers the config questions by the
names DeepSpeedEngine answers them (tests/integrations/test_deepspeed.py runs the real engine on two ranks)."""
from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.deepspeed_engine import is_deepspeed_engine
from gradcache.losses import NTXent


class Engine(nn.Module):
    """Stands in for deepspeed.DeepSpeedEngine: its config through the engine's own accessor names."""

    def __init__(self, stage=2, steps=1, fp16=False, autocast_dtype=None, managed=True, pipeline=False):
        super().__init__()
        self.module = nn.Linear(3, 2)
        self.stage, self.steps, self.fp16, self.autocast_dtype = stage, steps, fp16, autocast_dtype
        self.managed, self.pipeline_parallelism = managed, pipeline

    def zero_optimization_stage(self):
        return self.stage

    def gradient_accumulation_steps(self):
        return self.steps

    def fp16_enabled(self):
        return self.fp16

    def torch_autocast_enabled(self):
        return self.autocast_dtype is not None

    def torch_autocast_dtype(self):
        return self.autocast_dtype

    def managed_gradient_accumulation(self):
        return self.managed

    def coalesce_grad_reduction(self):
        return contextlib.nullcontext()


class OldEngine(Engine):
    coalesce_grad_reduction = None  # deepspeed 0.19.0 had none


@pytest.fixture
def deepspeed_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(DeepSpeedEngine=Engine, __version__="0.19.0"))


REFUSED = [
    (Engine(steps=4), "gradient_accumulation_steps is 4"),
    (Engine(stage=0), "zero_optimization.stage is 0"),
    (Engine(fp16=True), "fp16.enabled"),
    (Engine(autocast_dtype=torch.float16), "torch_autocast.dtype float16"),
    (Engine(managed=False), "managed_gradient_accumulation is false"),
    (Engine(pipeline=True), "PipelineModule"),
    (OldEngine(), r"deepspeed 0.19.0 has no engine.coalesce_grad_reduction\(\).*deepspeed>=0.19.1"),
]


@pytest.mark.parametrize("strategy", [GradCache, CachedLoss, NaiveAccumulation, FullBatch])
@pytest.mark.parametrize("engine, message", REFUSED)
def test_configs_that_cannot_be_exact_are_refused_naming_the_key(deepspeed_module, strategy, engine, message):
    with pytest.raises(ValueError, match=message):
        strategy(engine, NTXent(), 2)


def test_stages_1_to_3_in_bf16_or_fp32_are_accepted(deepspeed_module):
    for engine in (Engine(stage=1), Engine(stage=3), Engine(autocast_dtype=torch.bfloat16)):
        GradCache(engine, NTXent(), 2)


def test_nothing_is_an_engine_without_deepspeed_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    assert not is_deepspeed_engine(Engine())
    GradCache(Engine(steps=4), NTXent(), 2)  # a plain module then: nothing to refuse
