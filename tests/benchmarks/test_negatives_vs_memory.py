"""Smoke tests of benchmarks/negatives_vs_memory.py at tiny sizes: every strategy measures, the sweep writes
its CSV columns and both PNGs, a fresh process reports back, and a point over the memory budget is recorded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import negatives_vs_memory as bench
from benchmarks.fresh_process import run_point

TINY = {"task": "simclr", "model": "convnet", "image_size": 8, "batch": 4, "chunk": 2, "text_length": 6,
        "tile_size": 2, "steps": 1, "warmup": 0, "threads": 0, "device": "cpu", "memory_budget_gb": 0}
TINY_FLAGS = ["--image-size", "8", "--batch", "4", "--chunk", "2", "--text-length", "6", "--tile-size", "2",
              "--steps", "1", "--warmup", "0", "--threads", "0", "--memory-budget-gb", "0"]


def _in_process(module: str, point: dict, time_budget_s: float | None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.measure_point(point)


def test_clip_points_measure_with_two_towers() -> None:
    for strategy in ("gradcache", "loss_only"):  # SimCLR's points all run in the sweep test below
        result = bench.measure_point({**TINY, "task": "clip", "strategy": strategy})
        assert result["status"] == "ok", (strategy, result)
        assert result["peak_mb"] >= 0 and result["step_s"] > 0 and result["input_mb"] > 0
        assert ("nograd_forward_s" in result) == (strategy == "gradcache")


def test_interleaved_point_times_naive_gradcache_and_the_forward_in_one_process() -> None:
    result = bench.measure_point({**TINY, "strategy": bench.INTERLEAVED, "steps": 1})
    assert result["status"] == "ok"
    assert min(result["naive_step_s"], result["step_s"], result["nograd_forward_s"]) > 0
    expected = (result["step_s"] - result["naive_step_s"]) / result["nograd_forward_s"]  # one round: its own ratio
    assert result["extra_over_nograd"] == pytest.approx(expected)


def test_sweep_writes_csv_columns_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    assert bench.main([*TINY_FLAGS, "--output-dir", str(tmp_path), "--name", "sweep"]) == 0
    header, rows = read_csv(tmp_path / "sweep.csv")
    assert header == bench.COLUMNS
    assert [row["strategy"] for row in rows] == bench.DEFAULT_STRATEGIES
    assert all(row["status"] == "ok" and row["loadavg_1m"] for row in rows)
    by_strategy = {row["strategy"]: row for row in rows}
    # negatives per anchor from NT-Xent's 2N views: the whole batch, or only the micro-batch when accumulating
    assert by_strategy["gradcache"]["negatives_per_anchor"] == str(2 * 4 - 2)
    assert by_strategy["naive"]["negatives_per_anchor"] == str(2 * 2 - 2)
    float(by_strategy["gradcache"]["extra_over_nograd"])  # the core issue's ratio is filled in
    assert (tmp_path / "sweep.png").stat().st_size > 0 and (tmp_path / "sweep_by_batch.png").stat().st_size > 0


@pytest.mark.slow
def test_fresh_process_reports_an_over_budget_point_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    module = bench.__spec__.name
    # 1 MiB: the two views alone take 1.5 MiB, so the child's watchdog stops the point
    result = run_point(module, {**TINY, "batch": 64, "image_size": 32, "strategy": "full_batch",
                                "memory_budget_gb": 2**-10, "steps": 3}, time_budget_s=120)
    assert result["status"] == "over_memory_budget", result

    calls = []

    def over_budget_at_8(module: str, point: dict, time_budget_s: float | None) -> dict:
        calls.append((point["strategy"], point["batch"]))
        return {"status": "over_memory_budget"} if point["batch"] >= 8 else bench.measure_point(point)

    monkeypatch.setattr(bench, "run_point", over_budget_at_8)
    args = bench.get_args_parser().parse_args([*TINY_FLAGS[4:], "--min-batch", "4", "--max-batch", "16",
                                               "--strategies", "naive,loss_only", "--image-size", "8"])
    rows = bench.sweep(args, module)
    assert calls == [("naive", 4), ("loss_only", 4), ("naive", 8), ("loss_only", 8)]  # none at 16
    assert [row["status"].split(" ")[0] for row in rows] == ["ok", "ok", "over_memory_budget",
                                                            "over_memory_budget", "skipped", "skipped"]
    json.dumps(rows)  # rows stay plain data for the CSV


def test_a_run_writes_to_a_new_folder_of_its_own_unless_asked_for_the_committed_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.flags import output_folder
    from benchmarks.report import RESULTS_DIR

    monkeypatch.chdir(tmp_path)
    parser = bench.get_args_parser()
    fresh = output_folder(parser.parse_args([]))
    assert fresh.resolve().parent == (tmp_path / "runs" / "benchmarks").resolve() and fresh.is_dir()
    assert fresh.name.startswith("negatives_vs_memory-")
    assert output_folder(parser.parse_args(["--output-dir", "mine"])) == Path("mine")
    assert output_folder(parser.parse_args(["--write-results"])) == RESULTS_DIR
    with pytest.raises(SystemExit):  # one destination: both at once is a usage error
        parser.parse_args(["--write-results", "--output-dir", "mine"])
