"""Smoke tests of benchmarks/late_interaction_memory.py at tiny sizes: both modes measure the same loss, the sweep
writes its CSV and PNG with the tiled mode alone at the extra size, and one point runs in a fresh process."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import late_interaction_memory as bench
from benchmarks.fresh_process import run_point

TINY = ["--dim", "4", "--query-length", "3", "--document-length", "5", "--tile-size", "4", "--repeats", "1",
        "--threads", "1"]


def _in_process(module: str, point: dict, time_budget_s: float | None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


def test_sweep_measures_one_loss_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    bench.main(["--sizes", "6,12", "--tiled-sizes", "24", *TINY, "--output-dir", str(tmp_path)])
    header, rows = read_csv(tmp_path / "late_interaction_memory.csv")
    assert header == bench.COLUMNS
    assert [(row["mode"], row["n"]) for row in rows] == [("dense", "6"), ("dense", "12"), ("tiled", "6"),
                                                          ("tiled", "12"), ("tiled", "24")]
    assert all(row["status"] == "ok" for row in rows)
    for n in ("6", "12"):
        values = [float(row["loss_value"]) for row in rows if row["n"] == n]
        assert max(values) - min(values) < 1e-5
    assert (tmp_path / "late_interaction_memory.png").stat().st_size > 0


def test_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="--modes: unknown value 'blocks'"):
        bench.main(["--modes", "blocks", "--sizes", "8"])


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process() -> None:
    point = {"mode": "tiled", "n": 8, "hard_negatives": 1, "dim": 4, "query_length": 3, "document_length": 5,
             "tile_size": 4, "column_tile_size": None, "threads": 1, "device": "cpu", "repeats": 1,
             "long_run_s": 20.0, "memory_budget_gb": 4.0}
    result = run_point(bench.__spec__.name, point, time_budget_s=120)
    assert result["status"] == "ok", result
    assert result["peak_gb"] >= 0 and result["step_s"] > 0
