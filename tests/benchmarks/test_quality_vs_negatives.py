"""Smoke test of benchmarks/quality_vs_negatives.py: one tiny training run per strategy through the training
CLI, then the CSV columns, the summary and the PNG."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import quality_vs_negatives as bench


@pytest.mark.slow
def test_one_tiny_run_per_strategy_writes_csv_summary_and_plot(tmp_path: Path, read_csv) -> None:
    argv = ["--batches", "4", "--chunk", "2", "--steps", "1", "--seeds", "0", "--train-size", "8", "--test-size",
            "8", "--width", "8", "--image-size", "16", "--knn-k", "2", "--threads", "0", "--output-dir",
            str(tmp_path), "--runs-dir", str(tmp_path / "runs")]
    assert bench.main(argv) == 0
    header, rows = read_csv(tmp_path / "quality_vs_negatives.csv")
    assert header == bench.COLUMNS
    finals = {row["strategy"]: row for row in rows if row["final"] == "True"}
    assert sorted(finals) == sorted(bench.STRATEGIES)
    assert all(row["step"] == "1" for row in finals.values())
    assert finals["naive"]["negatives_per_anchor"] == str(2 * 2 - 2)
    assert finals["gradcache"]["negatives_per_anchor"] == finals["full"]["negatives_per_anchor"] == str(2 * 4 - 2)
    summary_header, summary = read_csv(tmp_path / "quality_vs_negatives_summary.csv")
    assert summary_header == bench.SUMMARY and len(summary) == 3
    assert (tmp_path / "quality_vs_negatives.png").stat().st_size > 0
