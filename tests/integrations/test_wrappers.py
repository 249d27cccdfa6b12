"""check_wrapper: the wrappers GradCache cannot run inside are refused by name before any forward."""
from __future__ import annotations

import pytest
from torch import nn

from gradcache.integrations.wrappers import check_wrapper


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
