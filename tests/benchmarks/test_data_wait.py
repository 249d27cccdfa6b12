"""Smoke tests of benchmarks/data_wait.py: a real tiny run on generated shards is read back from its logs, and the
settings take turns, a fresh run each, in an order rotated every round."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import data_wait

TINY = ["--size", "120", "--shard-size", "40", "--image-size", "16", "--test-size", "16", "--batch-size", "16",
        "--chunk-size", "8", "--threads", "1"]


@pytest.mark.slow
def test_a_run_on_shards_is_read_back_from_its_logs(tmp_path: Path, read_csv) -> None:
    out = tmp_path / "out"
    flags = [*TINY, "--workers", "1", "--rounds", "1", "--steps", "3", "--data-dir", str(tmp_path / "data"),
             "--output-dir", str(out)]
    assert data_wait.main(flags) == 0
    header, rows = read_csv(out / "data_wait.csv")
    assert header == data_wait.COLUMNS and len(rows) == 1
    [row] = rows
    assert (row["part"], row["workers"], row["steps"]) == ("clip-shards", "1", "3")
    assert float(row["median_step_s"]) > 0 and float(row["train_wall_s"]) > 0
    assert all(0 <= float(row[figure]) for figure in data_wait.FIGURES)
    assert 0 <= float(row["data_wait_share"]) < 1 and 0 <= float(row["wait_share_after_step1"]) < 1
    header, summary = read_csv(out / "data_wait_summary.csv")
    assert header == ["part", "workers", "rounds", *data_wait.FIGURES] and summary[0]["rounds"] == "1"
    assert not list((tmp_path / "data" / "runs").iterdir())  # the run folder removed once read


def test_settings_take_turns_in_an_order_rotated_every_round(tmp_path: Path, monkeypatch, read_csv) -> None:
    order = []

    def fake_run(command, **_):
        workers = command[command.index("--workers") + 1]
        order.append(workers)
        folder = Path(command[command.index("--output-dir") + 1])
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"batch_size": 16, "data_wait_share": 0.5,
                                                         "wall_time_s": 1.0}))
        wait = 0.1 * (1 + len(order))  # a different figure per run, so the medians are checked
        (folder / "train_log.csv").write_text(f"step,samples_per_s,data_wait_s\n1,16.0,0.5\n2,16.0,{wait}\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(data_wait.subprocess, "run", fake_run)
    flags = [*TINY, "--workers", "0,2,4", "--rounds", "3", "--steps", "2", "--data-dir", str(tmp_path / "data"),
             "--output-dir", str(tmp_path / "out")]
    assert data_wait.main(flags) == 0
    assert order == ["0", "2", "4", "2", "4", "0", "4", "0", "2"]
    _, summary = read_csv(tmp_path / "out" / "data_wait_summary.csv")
    # run k waits 0.1 (k + 1) s of a 1 s step: workers 0 ran 1st, 6th and 8th, 2 ran 2nd, 4th, 9th, 4 the rest
    assert [(row["workers"], row["median_data_wait_s"]) for row in summary] == [("0", "0.7"), ("2", "0.5"),
                                                                               ("4", "0.6")]
