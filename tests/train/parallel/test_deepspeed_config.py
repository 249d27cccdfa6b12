"""deepspeed_config: the batch keys of a --deepspeed file follow --batch-size; what contradicts it is refused."""
from __future__ import annotations

import json

import pytest

from gradcache.train.errors import USAGE, UsageError
from gradcache.train.parallel.deepspeed import deepspeed_config


def write(tmp_path, config):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


@pytest.mark.parametrize("given", [{}, {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                        "gradient_accumulation_steps": "auto"},
                                   {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16,
                                    "gradient_accumulation_steps": 1}])
def test_batch_keys_follow_the_global_batch(tmp_path, given):
    config = deepspeed_config(write(tmp_path, {**given, "zero_optimization": {"stage": 3}}), 64, 4)
    assert config == {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                      "zero_optimization": {"stage": 3}}


@pytest.mark.parametrize("config, message", [
    ({"train_micro_batch_size_per_gpu": 8}, "train_micro_batch_size_per_gpu is 8, but --batch-size 64 over 4 ranks "
                                            "makes it 16"),
    ({"train_batch_size": 32}, "train_batch_size is 32, but --batch-size 64 makes it 64"),
    ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps is 4, but GradCache"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, r"optimizer.params.lr is \"auto\""),
    ("[1, 2]", "must be a JSON object, got list"),
    ('{"zero_optimization": {"stage": 2,}}', "not valid JSON"),
])
def test_what_contradicts_the_run_is_refused_naming_both(tmp_path, config, message):
    with pytest.raises(UsageError, match=message) as error:
        deepspeed_config(write(tmp_path, config), 64, 4)
    assert error.value.exit_status == USAGE


def test_a_missing_file_or_an_uneven_batch_is_refused(tmp_path):
    with pytest.raises(UsageError, match="missing.json: cannot read the file"):
        deepspeed_config(tmp_path / "missing.json", 64, 4)
    with pytest.raises(UsageError, match="--batch-size 30 does not split over 4 ranks"):
        deepspeed_config(write(tmp_path, {}), 30, 4)
