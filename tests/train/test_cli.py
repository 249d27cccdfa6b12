import csv
import json

import pytest
import torch

import gradcache
from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.train.conftest import TINY


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


# every (mode, strategy), (mode, precision) and (strategy, precision) pair once: 6 runs, not the 12 of the grid
@pytest.mark.curves
@pytest.mark.parametrize(("mode", "strategy", "precision"), [
    ("simclr", "gradcache", "bf16"), ("simclr", "naive", "fp32"), ("simclr", "full", "bf16"),
    ("clip", "gradcache", "fp32"), ("clip", "naive", "bf16"), ("clip", "full", "fp32")])
def test_smoke_every_mode_strategy_and_precision(tmp_path, tiny_args, mode, strategy, precision, capsys):
    assert main(tiny_args(mode, tmp_path, "--strategy", strategy, "--precision", precision)) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["wall_time_s"] > 0 and metrics["peak_memory_mb"] > 0
    if mode == "simclr":
        for key in ("knn_top1", "knn_top1_raw_pixels", "knn_top1_random_init"):
            assert 0 <= metrics[key] <= 100
    else:
        for direction in ("image_to_text", "text_to_image"):
            for k in (1, 5, 10):
                assert 0 <= metrics[f"{direction}_recall@{k}"] <= 100
        assert 0 <= metrics["zero_shot_top1"] <= 100
    rows = _losses(tmp_path)
    assert [step for step, _ in rows] == [1, 2] and all(float(loss) > 0 for _, loss in rows)
    # the negatives the loss sees: naive accumulation contrasts within a chunk of 8, the others the batch of 16
    seen = 8 if strategy == "naive" else 16
    expected = 2 * seen - 2 if mode == "simclr" else seen - 1
    assert gradcache.negatives_per_anchor(strategy, "ntxent" if mode == "simclr" else "clip", 16, 8) == expected
    with open(tmp_path / "train_log.csv", newline="") as handle:
        assert [int(row["negatives_per_anchor"]) for row in csv.DictReader(handle)] == [expected] * 2
    assert metrics["negatives_per_anchor"] == expected
    with open(tmp_path / "train_log.csv", newline="") as handle:
        assert {"step", "loss", "lr", "samples_per_s"} <= set(next(csv.reader(handle)))
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2  # the evaluation is printed
    with open(tmp_path / "eval_log.csv", newline="") as handle:
        evaluations = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in evaluations] == [0, 2]  # every mode: the model at step 0, and at the end
    scored = {key for key in metrics if "recall@" in key or key in ("knn_top1", "zero_shot_top1")}
    assert set(metrics["step0"]) == scored  # metrics.json keeps step 0 beside the final scores
    assert {k: float(evaluations[0][k]) for k in scored} == pytest.approx({k: metrics["step0"][k] for k in scored})
    if mode == "simclr":
        assert metrics["step0"]["knn_top1"] == metrics["knn_top1_random_init"]


@pytest.mark.slow
def test_the_log_says_how_long_each_step_waited_for_its_batch(tmp_path, tiny_args, monkeypatch):
    """data_wait_s is the wait for the batch alone: a loader that sleeps 0.3 s before each batch shows it, within
    the step's own time (1 / samples_per_s of the batch), and metrics.json's data_wait_share is its share."""
    import time

    from gradcache.train.modes.simclr import SimCLR

    batches = SimCLR.batches

    def slow(self, *args):
        for batch in batches(self, *args):
            time.sleep(0.3)
            yield batch

    monkeypatch.setattr(SimCLR, "batches", slow)
    assert main(tiny_args("simclr", tmp_path, "--steps", "3")) == 0
    with open(tmp_path / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    waits = [float(row["data_wait_s"]) for row in rows]
    steps = [16 / float(row["samples_per_s"]) for row in rows]  # the batch of TINY, over the step's seconds
    assert all(0.3 <= wait <= step * 1.01 for wait, step in zip(waits, steps)), (waits, steps)
    share = json.loads((tmp_path / "metrics.json").read_text())["data_wait_share"]
    assert share == pytest.approx(sum(waits) / sum(steps), rel=0.05, abs=1e-3)


def test_gradcache_and_full_batch_train_the_same_model(tmp_path, tiny_args):
    """GradCache's gradient is the full batch's, so a few steps give the same weights (fp32, GroupNorm)."""
    for strategy in ("gradcache", "full"):
        assert main(tiny_args("simclr", tmp_path / strategy, "--strategy", strategy, "--steps", "3",
                              "--norm", "group")) == 0
    cached, full = (load_checkpoint(tmp_path / s)["model"] for s in ("gradcache", "full"))
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simclr", "clip"])
def test_resume_logs_the_same_losses_as_an_uninterrupted_run(tmp_path, tiny_args, killed_after_step, mode):
    args = ["--steps", "4", "--checkpoint-every", "2", "--train-size", "48"]  # 3 steps per epoch: crosses one
    assert main(tiny_args(mode, tmp_path / "whole", *args)) == 0

    killed_after_step(3, tiny_args(mode, tmp_path / "cut", *args))  # the checkpoint holds step 2
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    # same thread count as before: a different one may reorder float sums in the convolutions
    assert main(["train", mode, "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d) for d in ("whole", "cut"))
    for name in whole["model"]:
        assert torch.equal(whole["model"][name], resumed["model"][name]), name
    assert torch.equal(whole["loss"].get("logit_scale", torch.zeros(())),
                       resumed["loss"].get("logit_scale", torch.zeros(())))


@pytest.mark.slow
def test_a_resume_keeps_the_runs_workers_unless_given(tmp_path, tiny_args):
    """Streamed data's order depends on the worker count, so --workers stays the run's (0 here, the default is 1)
    unless the resume gives it anew."""
    assert main(tiny_args("simclr", tmp_path, "--steps", "2")) == 0
    assert main(["train", "simclr", "--resume", str(tmp_path), "--steps", "3", "--quiet"]) == 0
    assert load_checkpoint(tmp_path)["args"]["workers"] == 0
    assert main(["train", "simclr", "--resume", str(tmp_path), "--steps", "4", "--quiet", "--workers", "1"]) == 0
    assert load_checkpoint(tmp_path)["args"]["workers"] == 1


def test_a_worker_process_draws_the_same_views(tmp_path, tiny_args):
    """Each view is seeded by (seed, epoch, index), so augmenting in a worker changes nothing."""
    assert main(tiny_args("simclr", tmp_path / "main", "--threads", "2")) == 0
    assert main(tiny_args("simclr", tmp_path / "worker", "--threads", "2", "--workers", "1")) == 0
    main_run, worker_run = (load_checkpoint(tmp_path / d)["model"] for d in ("main", "worker"))
    for name in main_run:
        assert torch.equal(main_run[name], worker_run[name]), name


def test_eval_subcommand_reproduces_the_final_metrics(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path)) == 0
    trained = json.loads((tmp_path / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(tmp_path), "--output-json", str(tmp_path / "again.json")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["knn_top1"] == pytest.approx(trained["knn_top1"])
    assert evaluated["knn_top1_raw_pixels"] == trained["knn_top1_raw_pixels"]
    assert json.loads((tmp_path / "again.json").read_text()) == evaluated


def test_batchnorm_statistics_advance_once_with_grad_checkpointing(tmp_path, tiny_args):
    args = ["--norm", "batch", "--strategy", "full"]
    assert main(tiny_args("simclr", tmp_path / "plain", *args)) == 0
    assert main(tiny_args("simclr", tmp_path / "checkpointed", *args, "--grad-checkpointing")) == 0
    plain, checkpointed = (load_checkpoint(tmp_path / d)["model"] for d in ("plain", "checkpointed"))
    tracked = [name for name in plain if name.endswith("num_batches_tracked")]
    assert tracked and all(int(plain[name]) == 4 for name in tracked)  # 2 steps x 2 views, once each
    for name in plain:
        if "running" in name or "num_batches" in name:
            torch.testing.assert_close(checkpointed[name], plain[name], msg=name)


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_checkpoint(tmp_path, tiny_args, monkeypatch, capsys):
    from gradcache import losses

    original = losses.NTXent.forward
    calls = {"count": 0}

    def nan_on_step_3(self, z1, z2):
        calls["count"] += 1
        value = original(self, z1, z2)
        return value * float("nan") if calls["count"] > 2 else value  # full strategy: one call per step

    monkeypatch.setattr(losses.NTXent, "forward", nan_on_step_3)
    status = main(tiny_args("simclr", tmp_path, "--strategy", "full", "--steps", "4", "--checkpoint-every", "2"))
    assert status == errors.DIVERGED
    assert "the loss became non-finite at step 3" in capsys.readouterr().err
    assert load_checkpoint(tmp_path)["step"] == 2


def _learning_rates(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [float(row["lr"]) for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.parametrize("longer", [["--steps", "5"], ["--epochs", "2"]])
def test_resume_with_more_steps_continues_on_a_recomputed_schedule(tmp_path, tiny_args, capsys, longer):
    """A finished 2-step run resumed with --steps 5 (or --epochs 2: 8 steps of 16 out of 64 images) trains the
    new steps under the warm-up cosine schedule of the new length, and says so on stderr."""
    from gradcache.train.optim.optimizers import scaled_learning_rate
    from gradcache.train.optim.schedule import WarmupCosine

    assert main(tiny_args("simclr", tmp_path)) == 0
    before = load_checkpoint(tmp_path)
    capsys.readouterr()
    assert main(["train", "simclr", "--resume", str(tmp_path), *longer, "--quiet", "--workers", "0"]) == 0
    total = 5 if longer[0] == "--steps" else 8
    assert f"extended from 2 to {total} steps" in capsys.readouterr().err
    after = load_checkpoint(tmp_path)
    assert after["step"] == after["total_steps"] == total
    assert [step for step, _ in _losses(tmp_path)] == list(range(1, total + 1))
    peak = scaled_learning_rate(2e-3, 16, 256, "sqrt")
    schedule = WarmupCosine(1, total)
    assert _learning_rates(tmp_path)[2:] == pytest.approx([peak * schedule(s) for s in range(2, total)], rel=1e-5)
    assert _learning_rates(tmp_path)[:2] == pytest.approx([peak * WarmupCosine(1, 2)(s) for s in range(2)], rel=1e-5)
    for name in before["model"]:  # the new steps trained on from the saved weights
        assert not torch.equal(before["model"][name], after["model"][name]) or "num_batches" in name


def test_a_warmup_longer_than_the_run_is_cut_to_it_and_said_once(tmp_path, capsys):
    """SimCLR's default --warmup (10) in a 2-step run: the run still trains, warming up over both steps, lr
    (s + 1) / 2 of the peak at step s, and one line on stderr says so, --quiet or not; its resume does not repeat it."""
    from gradcache.train.config import RunConfig
    from gradcache.train.modes.simclr import SimCLR
    from gradcache.train.optim.optimizers import scaled_learning_rate

    warmup = SimCLR.defaults.get("warmup", RunConfig.warmup)
    assert warmup > 2
    at = TINY["simclr"].index("--warmup")
    argv = ["train", "simclr", *TINY["simclr"][:at], *TINY["simclr"][at + 2:], "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "--warmup" in line]
    expected = (f"gradcache train: --warmup {warmup} is longer than the run's 2 steps; it is cut to 2, so the whole "
                "run warms up (give --warmup below 2 for a cosine decay after it)")
    assert said == [expected]
    peak = scaled_learning_rate(2e-3, 16, 256, "sqrt")
    assert _learning_rates(tmp_path) == pytest.approx([peak * (s + 1) / 2 for s in range(2)], rel=1e-5)
    assert main(["train", "simclr", "--resume", str(tmp_path), "--steps", "3", "--quiet", "--workers", "0"]) == 0
    assert "is cut to" not in capsys.readouterr().err


def test_resume_may_not_shorten_a_run(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path, "--steps", "3")) == 0
    assert main(["train", "simclr", "--resume", str(tmp_path), "--steps", "2"]) == 2
    assert "fewer than the 3" in capsys.readouterr().err
    assert load_checkpoint(tmp_path)["step"] == 3
