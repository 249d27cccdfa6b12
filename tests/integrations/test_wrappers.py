"""check_wrapper: the wrappers GradCache cannot run inside are refused by name before any forward."""
from __future__ import annotations

import pytest
from torch import nn

from gradcache.integrations.wrappers import check_wrapper
from tests.test_deepspeed_engine import Engine, deepspeed_module  # noqa: F401  the fixture, used by name


class DeepSpeedEngine(nn.Module):  # stands in for deepspeed's engine, which owns the backward
    pass


class FullyShardedDataParallel(nn.Module):  # stands in for FSDP1, which reshards after the forward
    pass


@pytest.mark.parametrize("wrapper", [DeepSpeedEngine(), FullyShardedDataParallel(), nn.DataParallel(nn.Linear(2, 2))])
def test_unsupported_wrappers_are_refused_with_the_fix(wrapper):
    with pytest.raises(TypeError, match=f"inside {type(wrapper).__name__}.*fully_shard"):
        check_wrapper(wrapper, above_the_loss=True, where="GradCacheTrainer")


def test_plain_modules_pass():
    check_wrapper(nn.Linear(2, 2), above_the_loss=True, where="GradCacheTrainer")
    check_wrapper(nn.Sequential(nn.Linear(2, 2)), above_the_loss=False, where="GradCacheLoss")


def test_a_deepspeed_engine_above_the_loss_is_checked_where_the_trainer_coalesces(deepspeed_module):
    """GradCacheTrainer runs the engine's backward inside reduced_once_above_the_loss: the engine's config is checked
    by check_deepspeed_engine, the trainer named; a trainer that does not coalesce gets the TypeError."""
    check_wrapper(Engine(stage=3), above_the_loss=True, where="GradCacheTrainer", deepspeed_coalesced=True)
    with pytest.raises(ValueError, match="^GradCacheTrainer: gradient_accumulation_steps is 2 .*set it to 1"):
        check_wrapper(Engine(steps=2), above_the_loss=True, where="GradCacheTrainer", deepspeed_coalesced=True)
    with pytest.raises(ValueError, match="^GradCacheTrainer: fp16.enabled"):
        check_wrapper(Engine(fp16=True), above_the_loss=True, where="GradCacheTrainer", deepspeed_coalesced=True)
    with pytest.raises(TypeError, match="inside DeepSpeedEngine.*GradCacheTrainer"):
        check_wrapper(DeepSpeedEngine(), above_the_loss=True, where="GradCacheModule")
