"""Smoke tests of benchmarks/loss_memory.py at tiny sizes: the three modes measure the same loss, the sweep writes
its CSV and PNG, one point runs in a fresh process, and the interleaved timing rotates and summarises."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import loss_memory as bench
from benchmarks.fresh_process import run_point

POINT = {"loss": "clip", "n": 48, "dim": 8, "tile_size": 16, "column_tile_size": None, "threads": 1,
         "device": "cpu", "repeats": 1, "long_run_s": 20.0, "memory_budget_gb": 4.0}


def _in_process(module: str, point: dict, time_budget_s: float | None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process() -> None:
    result = run_point(bench.__spec__.name, {**POINT, "mode": "tiled"}, time_budget_s=120)
    assert result["status"] == "ok", result
    assert result["peak_gb"] >= 0 and result["step_s"] > 0 and result["runs"] == POINT["repeats"]


def test_strips_have_every_column_and_tiles_are_square_unless_asked() -> None:
    assert bench.column_tiles("strips", 48, None) == 96 and bench.column_tiles("strips", 48, 7) == 96
    assert bench.column_tiles("tiled", 48, None) is None and bench.column_tiles("tiled", 48, 7) == 7


def test_sweep_writes_all_three_modes_with_one_loss_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    bench.main(["--sizes", "24,48", "--modes", "dense,strips,tiled", "--dim", "8", "--tile-size", "16",
                "--column-tile-size", "8", "--repeats", "1", "--threads", "1", "--output-dir", str(tmp_path)])
    header, rows = read_csv(tmp_path / "loss_memory.csv")
    assert header == bench.COLUMNS + ["over_dense_time"]
    assert [(row["mode"], row["n"]) for row in rows] == [(mode, n) for mode in bench.MODES for n in ("24", "48")]
    assert all(row["status"] == "ok" and row["loadavg_1m"] for row in rows)
    assert {row["column_tile_size"] for row in rows if row["mode"] == "tiled"} == {"8"}
    assert [row["column_tile_size"] for row in rows if row["mode"] == "strips"] == ["48", "96"]
    for n in ("24", "48"):  # one loss, three ways of computing it
        values = [float(row["loss_value"]) for row in rows if row["n"] == n]
        assert max(values) - min(values) < 1e-5
    assert float(rows[-1]["predicted_gb"]) == pytest.approx(2 * float(rows[-2]["peak_gb"]))
    assert (tmp_path / "loss_memory.png").stat().st_size > 0


def test_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="--modes: unknown value 'blocks'"):
        bench.main(["--modes", "blocks", "--sizes", "8"])


def test_interleaved_timing_rotates_the_order_and_reports_medians(tmp_path: Path, read_csv) -> None:
    summary = bench.main(["--interleaved-n", "40", "--blocks", "8,16", "--rounds", "3", "--dim", "8",
                          "--tile-size", "16", "--threads", "1", "--output-dir", str(tmp_path)])
    assert [row["config"] for row in summary] == ["strips", "tiles 8", "tiles 16"]
    assert summary[0]["over_strips"] == 1.0 and all(row["rounds"] == 3 for row in summary)
    header, runs = read_csv(tmp_path / "loss_memory_interleaved.csv")
    assert header == bench.TIMING_COLUMNS
    assert [row["config"] for row in runs[:3]] == ["strips", "tiles 8", "tiles 16"]
    assert [row["config"] for row in runs[3:6]] == ["tiles 8", "tiles 16", "strips"]  # rotated
    assert len({round(float(row["loss_value"]), 5) for row in runs}) == 1  # one loss, every configuration
    for row in summary:
        times = sorted(float(run["step_s"]) for run in runs if run["config"] == row["config"])
        assert row["median_s"] == pytest.approx(times[1])
    _, written = read_csv(tmp_path / "loss_memory_interleaved_summary.csv")
    assert [row["config"] for row in written] == ["strips", "tiles 8", "tiles 16"]
