"""The --deepspeed file (issue 40 items 5, 6 and 7): one allowlist of the keys the program supports; every other key
the issue names is refused at start (exit 2, naming it, nothing written); each supported key that changes how ZeRO
works (buckets and overlap, optimizer and parameter offload) trains the losses of the plain stage's run; the file's
contents are kept in the run, so a resume under a changed file is refused naming the keys and one whose file is gone
resumes under the kept contents; and stdout is the JSON summary alone, DeepSpeed's own lines on stderr."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradcache.cli import main
from gradcache.train.parallel.deepspeed import SUPPORTED

ZERO_2 = {"zero_optimization": {"stage": 2}}
ZERO_3 = {"zero_optimization": {"stage": 3}}


def _file(folder: Path, config: dict, name: str = "ds.json") -> str:
    path = folder / name
    path.write_text(json.dumps(config))
    return str(path)


def _losses(run: Path) -> list[float]:
    with open(run / "train_log.csv", newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize(("config", "named"), [
    ({**ZERO_2, "managed_gradient_accumulation": True}, "managed_gradient_accumulation"),
    ({**ZERO_2, "bf16": True}, "bf16 is true"),
    ({**ZERO_2, "torch_autocast": {"enabled": False, "dtype": "bfloat16"}}, "torch_autocast is"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}, "offload_optimizer is"),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "offload_param needs stage 3"),
    ({**ZERO_2, "progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop is not a key"),
    ({**ZERO_2, "elasticity": {"enabled": True}}, "elasticity is not a key"),
    ({**ZERO_2, "amp": {"enabled": True}}, "amp is not a key"),
    ({**ZERO_2, "checkpoint": {"load_universal": True}}, "checkpoint is not a key"),
    ({**ZERO_2, "checkpoint": {"writer": {"type": "decoupled"}}}, "checkpoint is not a key"),
    ({**ZERO_2, "sequence_parallel_size": 2}, "sequence_parallel_size is not a key"),
    ({**ZERO_2, "tensor_parallel": {"autotp_size": 2}}, "tensor_parallel is not a key"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}, "reduce_bucket_size is 0"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}}, "stage3_prefetch_bucket_size is 0"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "zero_quantized_weights is not a key"),
    ({"zero_optimization": {"stage": 2, "zero_quantized_gradients": True}}, "zero_quantized_gradients is not"),
    ({**ZERO_2, "communication_data_type": "fp16"}, "communication_data_type is not a key"),
    ({"zero_optimization": 2}, "zero_optimization.stage is None"),
])
def test_every_key_outside_the_allowlist_exits_2_naming_it(tmp_path, capsys, tiny_args, config, named):
    assert main(tiny_args("simclr", tmp_path / "run", "--deepspeed", _file(tmp_path, config))) == 2
    assert named in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_allowlist_names_what_a_refusal_lists(tmp_path, capsys, tiny_args):
    assert main(tiny_args("simclr", tmp_path / "run", "--deepspeed", _file(tmp_path, {**ZERO_2, "amp": {}}))) == 2
    err = capsys.readouterr().err
    assert all(key in err for key in SUPPORTED)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The plain ZeRO-2 and ZeRO-3 runs, one process, 4 steps."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.train.conftest import TINY

    root = tmp_path_factory.mktemp("deepspeed_keys")
    losses = {}
    for name, config in (("zero2", ZERO_2), ("zero3", ZERO_3)):
        argv = ["train", "simclr", *TINY["simclr"], "--steps", "4", "--output-dir", str(root / name),
                "--deepspeed", _file(root, config, f"{name}.json")]
        assert main(argv) == 0
        losses[name] = _losses(root / name)
    return root, losses


@pytest.mark.slow
@pytest.mark.parametrize(("reference", "config"), [
    ("zero2", {"zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                     "reduce_bucket_size": 1000, "allgather_bucket_size": 1000,
                                     "reduce_scatter": False}, "steps_per_print": 1}),
    ("zero2", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
               "zero_force_ds_cpu_optimizer": False}),
    ("zero3", {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                     "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 0,
                                     "stage3_prefetch_bucket_size": 100, "sub_group_size": 1000},
               "zero_force_ds_cpu_optimizer": False, "bf16": {"enabled": False}}),
], ids=["buckets", "offload_optimizer", "offload_param"])
def test_supported_keys_train_the_plain_stages_losses(references, tmp_path, tiny_args, reference, config):
    root, losses = references
    assert main([*tiny_args("simclr", tmp_path / "run", "--deepspeed", _file(tmp_path, config)), "--steps", "4"]) == 0
    assert _losses(tmp_path / "run") == pytest.approx(losses[reference], rel=1e-5)


@pytest.mark.slow
def test_a_resume_keeps_the_file_it_started_with(references, tmp_path, tiny_args, capsys):
    """Stage 2 changed to 1 in the file after the run started: refused, naming the key; the file deleted: the run
    resumes under the settings it kept and logs the uninterrupted run's losses."""
    root, losses = references
    config = _file(tmp_path, ZERO_2)
    assert main([*tiny_args("simclr", tmp_path / "run", "--deepspeed", config), "--steps", "2"]) == 0
    Path(config).write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    capsys.readouterr()
    resume = ["train", "simclr", "--resume", str(tmp_path / "run"), "--steps", "4", "--quiet", "--workers", "0"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "has changed since the run started (zero_optimization.stage)" in err
    os.remove(config)
    assert main(resume) == 0
    assert "resumes under the settings it kept" in capsys.readouterr().err
    assert _losses(tmp_path / "run") == pytest.approx(losses["zero2"], rel=1e-5)


@pytest.mark.slow
def test_stdout_is_the_json_summary_alone(tmp_path):
    """DeepSpeed prints its communication backend's build line and logs on the stdout of its import: a separate
    process, as a user's shell sees it."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.train.conftest import TINY

    config = _file(tmp_path, {**ZERO_2, "steps_per_print": 1})
    argv = [sys.executable, "-m", "gradcache", "train", "simclr", *TINY["simclr"], "--steps", "2",
            "--output-dir", str(tmp_path / "run"), "--deepspeed", config]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["steps"] == 2
    evaluated = subprocess.run([sys.executable, "-m", "gradcache", "eval", str(tmp_path / "run")],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert isinstance(json.loads(evaluated.stdout), dict)
