"""`gradcache train --fsdp`: two forked ranks train, save `last.dcp` and resume it with the losses of an
uninterrupted run (inside the one fork of tests/test_fsdp.py, `cli_worker`); one process without torchrun; the
flag combinations and checkpoints that cannot work exit 2 before anything is written."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gradcache.cli import main
from gradcache.train import errors
from tests.train.conftest import TINY

STEPS = ["--steps", "4", "--checkpoint-every", "2", "--train-size", "48"]  # 3 steps per epoch: crosses one


def _losses(folder: Path) -> list[tuple[int, str]]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


def _train(mode: str, folder: Path, *extra: str) -> list[str]:
    return ["train", mode, *TINY[mode], "--output-dir", str(folder), *extra]


# The ranks' one thread: resizing the OpenMP pool in a process forked after the parent used it can hang.
ONE_THREAD = ["--threads", "1"]


def cli_worker(rank: int, world_size: int, folder: str) -> dict:
    """On every rank: a whole --fsdp run, one killed after step 3 (checkpoint at step 2), and its resume."""
    from gradcache.train.run_folder.log import RunLog

    root = Path(folder) / "cli"
    whole = main(_train("clip", root / "whole", "--fsdp", *STEPS, *ONE_THREAD))
    original = RunLog.log_step

    def crash_after_step_3(self, row):
        original(self, row)
        if row["step"] == 3:
            raise KeyboardInterrupt  # on every rank, as a kill of the job would

    RunLog.log_step = crash_after_step_3
    try:
        status = main(_train("clip", root / "cut", "--fsdp", *STEPS, *ONE_THREAD))
        cut = "interrupted" if status == errors.INTERRUPTED else "not interrupted"
    finally:
        RunLog.log_step = original
    if rank == 0:  # for the one-process resume in the test: the checkpoint at step 2 as two ranks left it
        shutil.copytree(root / "cut", root / "cut_at_2")
    dist.barrier()
    resumed = main(["train", "clip", "--resume", str(root / "cut"), "--quiet", "--workers", "0", *ONE_THREAD])
    return {"whole": whole, "cut": cut, "resumed": resumed, "folder": str(root)}


@pytest.fixture(scope="module")
def cli_runs():
    from tests.test_fsdp import fsdp_runs

    ranks, _ = fsdp_runs()
    return [r["cli"] for r in ranks]


@pytest.mark.slow
def test_two_ranks_save_shards_and_resume_with_the_same_losses(cli_runs):
    assert [(r["whole"], r["cut"], r["resumed"]) for r in cli_runs] == [(0, "interrupted", 0)] * 2
    root = Path(cli_runs[0]["folder"])
    assert sorted(p.name for p in (root / "whole" / "last.dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (root / "whole" / "last.pt").exists()
    assert [step for step, _ in _losses(root / "whole")] == [1, 2, 3, 4]
    assert _losses(root / "cut") == _losses(root / "whole")


@pytest.mark.slow
def test_one_process_resumes_the_two_rank_checkpoint(cli_runs):
    """Shards are keyed by parameter name: one process reads what two wrote and logs steps 3 and 4 as the two
    ranks did (up to the order of float sums: one process sums what two reduced)."""
    from gradcache.train.checkpoints.sharded import sharded_extra

    root = Path(cli_runs[0]["folder"])
    assert sharded_extra(root / "cut_at_2" / "last.dcp")["world_size"] == 2
    assert main(["train", "clip", "--resume", str(root / "cut_at_2"), "--quiet", "--workers", "0"]) == 0
    assert sharded_extra(root / "cut_at_2" / "last.dcp")["world_size"] == 1
    resumed, whole = _losses(root / "cut_at_2"), _losses(root / "whole")
    assert [step for step, _ in resumed] == [1, 2, 3, 4]
    for (_, one), (_, two) in zip(resumed[2:], whole[2:]):
        assert float(one) == pytest.approx(float(two), abs=1e-4)
    assert not dist.is_initialized()  # the one-process group is ended with the run


@pytest.mark.slow
def test_eval_reads_the_two_rank_shards_into_one_model(cli_runs, capsys):
    """`gradcache eval` on a last.dcp: the run's own final metrics, from shards two ranks wrote."""
    root = Path(cli_runs[0]["folder"]) / "whole"
    trained = json.loads((root / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(root)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    scored = [key for key in evaluated if "recall@" in key or key == "zero_shot_top1"]
    assert len(scored) >= 7 and evaluated["steps"] == trained["steps"] == 4
    for key in scored:
        assert evaluated[key] == pytest.approx(trained[key]), key


def _assert_export_holds_the_checkpoint(root: Path) -> None:
    """RUN/model, gathered from the shards at the end of the run, holds the weights of its last.dcp."""
    import gradcache.models
    from tests.train.export.helpers import program_model

    _, model, _ = program_model(root)
    exported = gradcache.models.from_pretrained(root / "model").state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(exported[key], value), key


@pytest.mark.slow
def test_two_ranks_export_the_whole_model(cli_runs):
    _assert_export_holds_the_checkpoint(Path(cli_runs[0]["folder"]) / "whole")


@pytest.mark.slow  # a training run in a process of its own (about 10 s): with the forked ranks' tests
def test_fsdp_on_one_process_without_torchrun(tmp_path):
    # In a process of its own: FSDP2's CPU offload starts autograd's device threads, and a test that forks ranks
    # after it in this process would fail ("Unable to handle autograd's threading ... fork") or hang.
    code = ("import sys, torch.distributed as dist; from gradcache.cli import main; "
            "status = main(sys.argv[1:]); sys.exit(status if status or not dist.is_initialized() else 99)")
    run = subprocess.run([sys.executable, "-c", code, *_train("simclr", tmp_path, "--fsdp", "--cpu-offload")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr  # 99: the process group it started was left up
    assert [step for step, _ in _losses(tmp_path)] == [1, 2]
    assert (tmp_path / "last.dcp" / "extra.pt").is_file()
    _assert_export_holds_the_checkpoint(tmp_path)


@pytest.mark.parametrize(("options", "message"), [
    (["--cpu-offload"], "--cpu-offload moves FSDP shards to CPU memory and needs --fsdp"),
    (["--fsdp", "--optimizer", "adamw8bit"], "cannot step parameters sharded by --fsdp"),
    (["--fsdp-reduce", "layer"], "invalid choice: 'layer'"),
])
def test_flag_combinations_that_cannot_work_exit_2(tmp_path, capsys, options, message):
    assert main(_train("simclr", tmp_path / "run", *options)) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_8bit_adamw_without_bitsandbytes_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as if not installed
    assert main(_train("simclr", tmp_path / "run", "--optimizer", "adamw8bit")) == 2
    assert "pip install bitsandbytes" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_8bit_adamw_without_a_kernel_for_the_device_exits_2(tmp_path, capsys, monkeypatch):
    def no_kernel(self, closure=None):
        raise NotImplementedError("no 8-bit kernel here")

    optimizer = type("AdamW8bit", (torch.optim.SGD,), {"step": no_kernel})
    fake = types.SimpleNamespace(__version__="0.0-test", optim=types.SimpleNamespace(AdamW8bit=optimizer))
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    assert main(_train("simclr", tmp_path / "run", "--optimizer", "adamw8bit")) == 2
    assert "no 8-bit AdamW for device 'cpu'" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_checkpoint_kinds_do_not_cross(tmp_path, capsys):
    """A last.pt given to --fsdp, and a last.dcp of another model, are refused before anything is written."""
    assert main(_train("simclr", tmp_path / "plain")) == 0
    assert main(["train", "simclr", "--resume", str(tmp_path / "plain"), "--fsdp"]) == 2
    assert "single-file checkpoint (last.pt) of a run without --fsdp" in capsys.readouterr().err
    assert main(_train("simclr", tmp_path / "sharded", "--fsdp")) == 0
    assert main(["train", "simclr", "--resume", str(tmp_path / "sharded"), "--width", "16"]) == 2
    assert "holds a different model" in capsys.readouterr().err
    assert main(["train", "clip", "--resume", str(tmp_path / "sharded")]) == 2
    assert "is a simclr checkpoint" in capsys.readouterr().err
