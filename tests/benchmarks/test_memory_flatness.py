"""Smoke test of benchmarks/memory_flatness.py at a few steps: the readings are taken and written."""
from __future__ import annotations

from pathlib import Path

from benchmarks import memory_flatness as bench
from gradcache.train.run_folder.log import RunLog


def test_reads_memory_every_n_steps_and_writes_the_csv(tmp_path: Path, read_csv, capsys) -> None:
    log_step = RunLog.log_step
    assert bench.main(["--total-steps", "4", "--early-step", "2", "--output-dir", str(tmp_path)]) == 0
    assert RunLog.log_step is log_step  # the probe is removed
    header, rows = read_csv(tmp_path / "memory_flatness.csv")
    assert header == ["step", "rss_mb", "cuda_max_allocated_mb"] and [row["step"] for row in rows] == ["2", "4"]
    assert all(float(row["rss_mb"]) > 0 for row in rows)
    assert "rss_mb:" in capsys.readouterr().out
