"""Smoke test of benchmarks/st_loss_speed.py on a tiny BERT: both sides measured round robin, the CSV written."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

from benchmarks import st_loss_speed as bench  # noqa: E402
from tests.integrations.sentence_models import save_tiny_bert  # noqa: E402


def test_both_sides_are_timed_and_written(tmp_path: Path, read_csv) -> None:
    model = save_tiny_bert(tmp_path / "bert")
    rows = bench.main(["--model", str(model), "--batch", "6", "--mini-batch", "4", "--negatives", "1",
                       "--words", "5", "--rounds", "2", "--threads", "0", "--output-dir", str(tmp_path)])
    assert [row["side"] for row in rows] == list(bench.SIDES)
    assert all(row["step_s"] > 0 and row["min_s"] <= row["step_s"] <= row["max_s"] for row in rows)
    header, written = read_csv(tmp_path / "st_loss_speed.csv")
    assert header == bench.COLUMNS and len(written) == 2


def test_round_robin_rotates_the_order_every_round() -> None:
    order = []
    steps = {name: (lambda name=name: order.append(name) or 0.0) for name in ("a", "b", "c")}
    times = bench.round_robin(steps, 3)
    assert order == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # warm-up round, then rotated
    assert all(len(t) == 3 for t in times.values())
