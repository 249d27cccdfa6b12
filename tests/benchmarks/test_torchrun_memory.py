"""Smoke tests of benchmarks/torchrun_memory.py: clip on tiny shards under torchrun on two gloo ranks, each rank's
tree measured; each rank compared with the one-process run. No threshold."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import torchrun_memory

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon needs Linux's /proc")
TINY = ["--parts", "clip", "--clip-size", "200", "--shard-size", "40", "--image-size", "16", "--test-size", "16",
        "--workers", "0"]


@pytest.mark.slow
def test_each_rank_of_a_torchrun_group_reports_its_tree(tmp_path: Path, read_csv) -> None:
    out = tmp_path / "out"
    flags = [*TINY, "--ranks", "2", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert torchrun_memory.main(flags) == 0
    header, rows = read_csv(out / "torchrun_memory.csv")
    assert header == torchrun_memory.COLUMNS
    assert [(row["ranks"], row["rank"], row["batch_size"]) for row in rows] == [("2", "0", "64"), ("2", "1", "64")]
    assert all(float(row[column]) > 0 for row in rows
               for column in ("first_step_s", "peak_rss_anon_mb", "peak_rss_anon_abs_mb"))
    assert [row["over_one_mb"] for row in rows] == ["", ""]  # no one-process run to compare with
    assert sorted(path.name for path in out.iterdir()) == ["torchrun_memory.csv"]


def test_every_rank_is_compared_with_the_one_process_run_whatever_the_order(tmp_path, read_csv, monkeypatch) -> None:
    launched = []

    def fake_run(argv, ranks=1, timeout_s=None, env=None):
        launched.append((ranks, argv[argv.index("--batch-size") + 1]))
        return [{"rank": rank, "status": 0, "first_step_s": 1.0, "peak_rss_anon_mb": 90.0,
                 "peak_rss_anon_abs_mb": 100.0 + 10 * ranks + rank} for rank in range(ranks)]

    monkeypatch.setattr(torchrun_memory.first_step, "run", fake_run)
    flags = [*TINY, "--ranks", "2,1", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out")]
    assert torchrun_memory.main(flags) == 0
    assert launched == [(1, "64"), (2, "64")]  # the one-process run's global batch
    launched.clear()
    assert torchrun_memory.main([*flags, "--batch-scope", "per-rank"]) == 0
    assert launched == [(1, "64"), (2, "128")]  # the one-process run's batch on every rank
    _, rows = read_csv(tmp_path / "out" / "torchrun_memory.csv")
    assert [(row["ranks"], row["rank"], row["over_one_mb"]) for row in rows] == [("1", "0", "0.0"), ("2", "0", "10.0"),
                                                                                ("2", "1", "11.0")]
