"""Smoke tests of the data scaling benchmarks at tiny sizes (a few hundred images or rows, one step): every part
runs and writes its CSV columns with positive figures. No threshold: time and memory are the lead's to measure."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import image_data_scaling

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon needs Linux's /proc")
TINY_IMAGES = ["--sizes", "100", "--image-size", "16", "--shard-size", "40", "--test-size", "16", "--threads", "1"]


def _positive_figures(rows: list[dict[str, str]], columns: list[str]) -> None:
    assert rows and all(float(row[column]) > 0 for row in rows for column in columns)


@pytest.mark.parametrize("parts, workers", [("simclr-folder,clip-shards", "0"), ("clip-table,simclr-shards", "1")])
def test_image_data_scaling_runs_each_part_one_step(tmp_path: Path, read_csv, parts: str, workers: str) -> None:
    out = tmp_path / "out"
    flags = ["--parts", parts, "--workers", workers, "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert image_data_scaling.main([*TINY_IMAGES, *flags]) == 0
    header, rows = read_csv(out / "image_data_scaling.csv")
    assert header == image_data_scaling.COLUMNS
    assert [row["part"] for row in rows] == parts.split(",")
    _positive_figures(rows, ["first_step_s", "peak_rss_anon_mb", "peak_rss_anon_abs_mb"])
    assert sorted(path.name for path in out.iterdir()) == ["image_data_scaling.csv"]  # the data and runs are apart
    assert not list((tmp_path / "data" / "runs").iterdir())  # each run folder removed after its point
