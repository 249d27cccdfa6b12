"""`gradcache train --deepspeed CONFIG.json`: the options and configs that the program cannot train exactly exit 2
before anything is written."""
from __future__ import annotations

import json
import sys

import pytest

from gradcache.cli import main

ZERO_2 = {"zero_optimization": {"stage": 2}}


def ds_file(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(path)


@pytest.mark.parametrize(("config", "message"), [
    ({}, "zero_optimization.stage is 0"),
    ({"zero_optimization": {"stage": 0}}, "zero_optimization.stage is 0"),
    ({**ZERO_2, "gradient_accumulation_steps": 4}, "gradient_accumulation_steps is 4"),
    ({**ZERO_2, "fp16": {"enabled": True}}, "fp16.enabled is true"),
    ({**ZERO_2, "bf16": {"enabled": True}}, "bf16.enabled is true"),
    ({**ZERO_2, "torch_autocast": {"enabled": True}}, "torch_autocast.enabled is true"),
    ({**ZERO_2, "optimizer": {"type": "Adam"}}, "has an 'optimizer' block"),
    ({**ZERO_2, "scheduler": {"type": "WarmupLR"}}, "has an 'scheduler' block"),
    ({**ZERO_2, "gradient_clipping": 1.0}, "gradient_clipping is 1.0"),
    ({**ZERO_2, "train_batch_size": 32}, "train_batch_size is 32, but --batch-size 16 makes it 16"),
    ("{not json", "not valid JSON"),
])
def test_configs_that_cannot_be_exact_exit_2(tmp_path, capsys, tiny_args, config, message):
    argv = tiny_args("simclr", tmp_path / "run", "--deepspeed", ds_file(tmp_path, config))
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_missing_config_file_exits_2(tmp_path, capsys, tiny_args):
    assert main(tiny_args("simclr", tmp_path / "run", "--deepspeed", str(tmp_path / "absent.json"))) == 2
    assert "cannot read the file" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("mode", "options", "message"), [
    ("simclr", ["--fsdp"], "--deepspeed cannot run with --fsdp"),
    ("simclr", ["--optimizer", "adamw8bit"], "--deepspeed cannot run with --optimizer adamw8bit"),
    ("simclr", ["--precision", "fp16"], "--deepspeed cannot run with --precision fp16"),
    ("clip", [], "--deepspeed cannot run with gradcache train clip"),
])
def test_options_beside_it_that_cannot_work_exit_2(tmp_path, capsys, tiny_args, mode, options, message):
    argv = tiny_args(mode, tmp_path / "run", "--deepspeed", ds_file(tmp_path, ZERO_2), *options)
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_without_deepspeed_installed_says_how_to_install(tmp_path, capsys, tiny_args, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import fails as if not installed
    assert main(tiny_args("simclr", tmp_path / "run", "--deepspeed", ds_file(tmp_path, ZERO_2))) == 2
    assert 'pip install -e ".[deepspeed]"' in capsys.readouterr().err and not (tmp_path / "run").exists()
