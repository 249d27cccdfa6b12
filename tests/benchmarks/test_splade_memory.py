"""Smoke tests of benchmarks/splade_memory.py at tiny sizes: the three modes measure the same loss on the same
model and batch, the sweep writes its CSV and PNG, and one point runs in a fresh process."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

from benchmarks import splade_memory as bench  # noqa: E402
from benchmarks.fresh_process import run_point  # noqa: E402

TINY = ["--dim", "16", "--vocab", "300", "--positive-fraction", "0.05", "--chunk", "3", "--repeats", "0",
        "--threads", "1"]


def _in_process(module: str, point: dict, time_budget_s: float | None, env: dict | None = None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


@pytest.mark.slow
def test_sweep_measures_one_loss_three_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_csv) -> None:
    """Three modes, one loss; with --rounds, one more point per N up to --rounds-up-to times the modes in turn:
    its medians and the sparse / peer ratio land in that N's rows, and N = 7 keeps its memory point's time."""
    monkeypatch.setattr(bench, "run_point", _in_process)
    bench.main(["--sizes", "4,7", *TINY, "--rounds", "1", "--rounds-up-to", "4", "--output-dir", str(tmp_path)])
    header, rows = read_csv(tmp_path / "splade_memory.csv")
    assert header == bench.COLUMNS
    assert [(row["mode"], row["n"]) for row in rows] == [(m, n) for m in bench.MODES for n in ("4", "7")]
    assert all(row["status"] == "ok" for row in rows)
    for n in ("4", "7"):
        values = [float(row["loss_value"]) for row in rows if row["n"] == n]
        assert max(values) - min(values) < 1e-5 * max(abs(v) for v in values)
        assert 0 < float(rows[0]["nonzero_fraction"]) < 0.5  # the bias shift made the rows sparse
    timed = [row for row in rows if row["n"] == "4"]
    assert all(row["runs"] == "1" and float(row["time_ratio"]) > 0 for row in timed)
    assert len({row["time_ratio"] for row in timed}) == 1  # one ratio per N, on every row of it
    assert all(row["time_ratio"] == "" for row in rows if row["n"] == "7")
    assert (tmp_path / "splade_memory.png").stat().st_size > 0


def test_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="--modes: unknown value 'cached'"):
        bench.main(["--modes", "cached", "--sizes", "8"])


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process() -> None:
    point = {"kind": "memory", "mode": "sparse", "n": 4, "chunk": 2, "dim": 16, "vocab": 300, "positive_fraction": 0.05, "threads": 1,
             "device": "cpu", "repeats": 0, "long_run_s": 20.0, "memory_budget_gb": 4.0}
    result = run_point(bench.__spec__.name, point, time_budget_s=300)
    assert result["status"] == "ok", result
    assert result["peak_gb"] >= 0 and result["step_s"] > 0
