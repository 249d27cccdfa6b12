"""`gradcache train --deepspeed CONFIG.json`: two forked gloo ranks train under ZeRO stages 1, 2 and 3 with the logged
losses and exported weights of a one-process DDP-free run (same seed, AdamW, fp32, GradCache), ZeRO-2 and ZeRO-3 runs
killed after step 3 resume their `last.ds` (step 2) with an uninterrupted run's losses, `--strategy naive` trains as
under DDP, `gradcache train text` runs under ZeRO-3 as in one process; the options and configs that the program cannot train exactly exit 2 before anything is written."""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from tests.train.conftest import TINY, text_args

STAGES = (1, 2, 3)
RESUMED = (2, 3)  # the stages whose killed run is resumed
# 4 steps of 16 over 48 images: an epoch of 3 steps, crossed; a checkpoint at step 2, then at the end
LONGER = ["--steps", "4", "--checkpoint-every", "2", "--train-size", "48", "--threads", "1"]


def _losses(folder: Path) -> list[tuple[int, float]]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), float(row["loss"])) for row in csv.DictReader(handle)]


def _simclr(folder: Path, *extra: str) -> list[str]:
    return ["train", "simclr", *TINY["simclr"], "--output-dir", str(folder), *LONGER, *extra]


def ranks_worker(rank: int, world_size: int, root: str, bert: str) -> dict:
    """On every rank: one run per ZeRO stage, a ZeRO-2 run killed after step 3 and its resume, a text run."""
    from gradcache.train.run_folder.log import RunLog

    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it
    root = Path(root)
    status = {stage: main(_simclr(root / f"zero{stage}", "--deepspeed", str(root / f"zero{stage}.json")))
              for stage in STAGES}
    original = RunLog.log_step

    def crash_after_step_3(self, row):
        original(self, row)
        if row["step"] == 3:
            raise KeyboardInterrupt  # on every rank, as a kill of the job would

    RunLog.log_step = crash_after_step_3
    try:
        for stage in RESUMED:
            status[f"cut{stage}"] = main(_simclr(root / f"cut{stage}", "--deepspeed", str(root / f"zero{stage}.json")))
    finally:
        RunLog.log_step = original
    for stage in RESUMED:
        status[f"resumed{stage}"] = main(["train", "simclr", "--resume", str(root / f"cut{stage}"), "--quiet",
                                          "--workers", "0", "--threads", "1"])
    # --strategy naive: each rank's micro-batches, as under DDP (whose negatives differ from one process's)
    status["naive"] = main(_simclr(root / "naive", "--strategy", "naive", "--deepspeed", str(root / "zero2.json")))
    status["naive_ddp"] = main(_simclr(root / "naive_ddp", "--strategy", "naive"))
    status["text"] = main(text_args(bert, root / "text", "--deepspeed", str(root / "zero3.json"), "--threads", "1"))
    return status


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tiny_bert):
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.multiprocess import run_on_ranks

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    root = tmp_path_factory.mktemp("deepspeed_program")
    for stage in STAGES:  # ZeRO-3 partitions every parameter: by default the tiny model's would all stay whole
        partitioned = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}
        (root / f"zero{stage}.json").write_text(json.dumps({"zero_optimization": {"stage": stage, **partitioned}}))
    return root, run_on_ranks(ranks_worker, 2, str(root), str(tiny_bert))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_bert):
    """The references: the same runs in one process, without DeepSpeed."""
    root = tmp_path_factory.mktemp("one_process")
    assert main(_simclr(root / "simclr")) == 0
    assert main(text_args(tiny_bert, root / "text")) == 0
    return root


def _exported(folder: Path) -> dict[str, torch.Tensor]:
    import gradcache.models

    return gradcache.models.from_pretrained(folder / "model").state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_two_ranks_train_each_zero_stage_as_one_process(ranks, one_process, stage):
    root, status = ranks
    assert [s[stage] for s in status] == [0, 0]
    run = root / f"zero{stage}"
    assert (run / "last.ds" / "extra.pt").is_file() and not (run / "last.pt").exists()
    ours, reference = _losses(root / f"zero{stage}"), _losses(one_process / "simclr")
    assert [step for step, _ in ours] == [1, 2, 3, 4]
    assert [loss for _, loss in ours] == pytest.approx([loss for _, loss in reference], abs=1e-5)
    exported, expected = _exported(root / f"zero{stage}"), _exported(one_process / "simclr")
    assert exported.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(exported[key], value, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("stage", RESUMED)
def test_a_killed_run_resumes_its_last_ds_with_the_same_losses(ranks, stage):
    root, status = ranks
    assert [(s[f"cut{stage}"], s[f"resumed{stage}"]) for s in status] == [(errors.INTERRUPTED, 0)] * 2
    assert _losses(root / f"cut{stage}") == _losses(root / f"zero{stage}")
    assert (root / f"cut{stage}" / "previous.ds" / "extra.pt").is_file()


@pytest.mark.slow
def test_naive_accumulation_trains_as_under_ddp(ranks):
    root, status = ranks
    assert [(s["naive"], s["naive_ddp"]) for s in status] == [(0, 0)] * 2
    ours, ddp = _losses(root / "naive"), _losses(root / "naive_ddp")
    assert [loss for _, loss in ours] == pytest.approx([loss for _, loss in ddp], abs=1e-5)


@pytest.mark.slow
def test_text_trains_under_zero_3_as_one_process(ranks, one_process):
    root, status = ranks
    assert [s["text"] for s in status] == [0, 0]
    ours, reference = _losses(root / "text"), _losses(one_process / "text")
    assert [loss for _, loss in ours] == pytest.approx([loss for _, loss in reference], abs=1e-5)
    ours = json.loads((root / "text" / "metrics.json").read_text())
    theirs = json.loads((one_process / "text" / "metrics.json").read_text())
    scored = [key for key in theirs if isinstance(theirs[key], float) and key not in ("wall_time_s", "peak_memory_mb",
                                                                                      "data_wait_share")]
    for key in scored:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-4), key

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
    ("simclr", ["--optimizer", "lars"], "--deepspeed cannot run with --optimizer lars: ZeRO steps flattened"),
    ("simclr", ["--optimizer", "lamb"], "--deepspeed cannot run with --optimizer lamb: ZeRO steps flattened"),
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


@pytest.mark.slow  # two DeepSpeed starts
def test_two_runs_in_one_process_each_get_a_live_process_group(tmp_path, tiny_args):
    """DeepSpeed keeps its clone of the world group and its communication backend for the life of the process:
    the second one-process run (a sweep, a notebook) must not be handed the first run's destroyed group, and
    after each run the process's environment is as it was (LOCAL_RANK left behind reads as a launch to an HF
    Trainer) and no backend holds torch.distributed's functions as the run found them (a process forked later
    patches its own)."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    import deepspeed.comm.comm as deepspeed_comm

    config = tmp_path / "zero2.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    launch = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
    environment = {name: os.environ.get(name) for name in launch}
    for run in ("first", "second"):
        assert main(tiny_args("simclr", tmp_path / run, "--deepspeed", str(config))) == 0, run
        assert {name: os.environ.get(name) for name in launch} == environment, run
        assert deepspeed_comm.cdb is None, run


@pytest.mark.slow
def test_eval_reads_the_zero_3_partitions_into_one_model(ranks, capsys):
    """`gradcache eval` on a last.ds, in one process without an engine: the run's own final metrics, from the
    partitions two ranks wrote."""
    root = ranks[0] / "zero3"
    trained = json.loads((root / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(root)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["steps"] == trained["steps"] == 4 and "knn_top1" in evaluated
    assert evaluated["knn_top1"] == pytest.approx(trained["knn_top1"])


@pytest.mark.slow
def test_one_process_cannot_resume_two_ranks_partitions(ranks, tmp_path, capsys):
    import shutil

    run = tmp_path / "zero2"
    shutil.copytree(ranks[0] / "zero2", run)
    def files():  # but the folder's lock, which the job takes
        return sorted((str(p), p.stat().st_mtime_ns) for p in run.rglob("*") if p.name != ".lock")

    before = files()
    assert main(["train", "simclr", "--resume", str(run), "--steps", "6", "--quiet", "--workers", "0"]) == 2
    assert "was saved by 2 ranks; a --deepspeed checkpoint resumes on as many" in capsys.readouterr().err
    assert files() == before


def test_a_step_the_engine_skips_counts_as_non_finite_gradients():
    """ZeRO keeps the reduced gradients in its partitions (.grad is empty): the engine's own skip (a non-finite
    gradient norm) is what the run's divergence check reads."""
    from gradcache.train.config import RunConfig
    from gradcache.train.parallel.deepspeed import DeepSpeedPlacement

    class Engine:
        skipped_steps = 0

        def __init__(self, skips):
            self.skips = skips

        def step(self):
            self.skipped_steps += self.skips

    placement = DeepSpeedPlacement(RunConfig(deepspeed="ds.json"))
    verdicts = []
    for skips in (0, 1):
        placement.engine = Engine(skips)
        verdicts.append(placement.optimizer_step(None, None))
    assert verdicts == [True, False]
