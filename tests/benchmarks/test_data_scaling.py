"""Smoke tests of the data scaling benchmarks at tiny sizes (a few hundred images or rows, one step): every part
runs and writes its CSV columns with positive figures. No threshold: time and memory are the lead's to measure."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import image_data_scaling, text_data_scaling

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon needs Linux's /proc")
TINY_IMAGES = ["--sizes", "100", "--image-size", "16", "--shard-size", "40", "--test-size", "16", "--threads", "1"]


def _positive_figures(rows: list[dict[str, str]], columns: list[str]) -> None:
    assert rows and all(float(row[column]) > 0 for row in rows for column in columns)


def test_image_data_scaling_runs_a_part_of_each_data_kind_one_step(tmp_path: Path, read_csv) -> None:
    """An image folder and shards (the caption table is the folder's files; the formats themselves are the
    program's tests), one of them with a loader worker in the measured tree."""
    out, parts = tmp_path / "out", "simclr-folder,clip-shards"
    flags = ["--parts", parts, "--workers", "1", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert image_data_scaling.main([*TINY_IMAGES, *flags]) == 0
    header, rows = read_csv(out / "image_data_scaling.csv")
    assert header == image_data_scaling.COLUMNS
    assert [row["part"] for row in rows] == parts.split(",")
    _positive_figures(rows, ["first_step_s", "peak_rss_anon_mb", "peak_rss_anon_abs_mb"])
    assert sorted(path.name for path in out.iterdir()) == ["image_data_scaling.csv"]  # the data and runs are apart
    assert not list((tmp_path / "data" / "runs").iterdir())  # each run folder removed after its point


def test_text_data_scaling_keeps_the_data_and_the_runs_apart_from_the_csv(tmp_path: Path, read_csv) -> None:
    out = tmp_path / "out"
    flags = ["--rows", "400", "--formats", "jsonl", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert text_data_scaling.main(flags) == 0
    header, rows = read_csv(out / "text_data_scaling.csv")
    assert {"rows", "format", "first_batch_s", "resume_s", "peak_rss_anon_mb"} <= set(header)
    assert [row["status"] for row in rows] == ["ok"]
    assert sorted(path.name for path in out.iterdir()) == ["text_data_scaling.csv"]
    assert (tmp_path / "data" / "rows-400.jsonl").exists() and not list((tmp_path / "data" / "runs").iterdir())


def test_text_data_scaling_program_times_a_real_text_step(tmp_path: Path, read_csv, monkeypatch, tiny_bert) -> None:
    # the data-alone point is the test above's; here only the program's one-step run is real
    monkeypatch.setattr(text_data_scaling, "run_point", lambda module, spec, budget: {"status": "ok"})
    out = tmp_path / "out"
    flags = ["--rows", "120", "--formats", "jsonl", "--program", "--threads", "1", "--model", str(tiny_bert), "--data-dir",
             str(tmp_path / "data"), "--output-dir", str(out)]
    assert text_data_scaling.main(flags) == 0
    header, rows = read_csv(out / "text_data_scaling.csv")
    program = ["program_first_step_s", "program_peak_rss_anon_mb", "program_peak_rss_anon_abs_mb"]
    assert set(program) <= set(header)
    _positive_figures(rows, program)
