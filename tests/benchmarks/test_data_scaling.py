"""Smoke tests of the data scaling benchmarks at tiny sizes (a few hundred images or rows, one step): every part
runs and writes its CSV columns with positive figures. No threshold: time and memory are the lead's to measure."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks import image_data, image_data_scaling, text_data_scaling

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon needs Linux's /proc")
TINY_IMAGES = ["--sizes", "100", "--image-size", "16", "--shard-size", "40", "--test-size", "16", "--threads", "1"]


def _positive_figures(rows: list[dict[str, str]], columns: list[str]) -> None:
    assert rows and all(float(row[column]) > 0 for row in rows for column in columns)


def test_the_generated_sets_hold_the_same_samples_as_the_program_reads_them(tmp_path: Path) -> None:
    """The folder, its caption table and the shards: `size` samples each, read by the training program's own
    readers (the formats' training is the program's tests; the benchmark's runs are below)."""
    from gradcache.train.data.images.shards import count_samples, find_shards

    root = image_data.image_folder(tmp_path, 30, 16)
    assert sorted(path.relative_to(root).as_posix() for path in root.rglob("*.jpg")) == [
        f"class{index % image_data.CLASSES}/{index:07d}.jpg" for index in sorted(range(30), key=lambda i: (i % image_data.CLASSES, i))]
    with open(image_data.caption_table(tmp_path, 30, 16), newline="") as handle:
        assert [row["title"] for row in csv.DictReader(handle)] == [image_data.caption(index) for index in range(30)]
    shards = find_shards(str(image_data.shards(tmp_path, 30, 16, shard_size=8)))
    assert len(shards) == 4 and [count_samples(shard, captions=True) for shard in shards] == [8, 8, 8, 6]


@pytest.mark.slow
def test_image_data_scaling_runs_one_step_on_shards_with_a_worker(tmp_path: Path, read_csv) -> None:
    out, parts = tmp_path / "out", "clip-shards"
    flags = ["--parts", parts, "--workers", "1", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert image_data_scaling.main([*TINY_IMAGES, *flags]) == 0
    header, rows = read_csv(out / "image_data_scaling.csv")
    assert header == image_data_scaling.COLUMNS
    assert [row["part"] for row in rows] == [parts]
    _positive_figures(rows, ["first_step_s", "peak_rss_anon_mb", "peak_rss_anon_abs_mb"])
    assert sorted(path.name for path in out.iterdir()) == ["image_data_scaling.csv"]  # the data and runs are apart
    assert not list((tmp_path / "data" / "runs").iterdir())  # each run folder removed after its point


@pytest.mark.slow
def test_text_data_scaling_keeps_the_data_and_the_runs_apart_and_times_a_real_step(tmp_path: Path, read_csv,
                                                                                    tiny_bert, monkeypatch,
                                                                                    capsys) -> None:
    """The data point in this process (its fresh process is fresh_process's, tested with the other benchmarks),
    the program's one-step run for real."""
    import json

    from benchmarks.fresh_process import RESULT_PREFIX

    def in_this_process(module, spec, budget):
        text_data_scaling.point(spec)
        printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(RESULT_PREFIX)]
        return json.loads(printed[-1][len(RESULT_PREFIX):])

    monkeypatch.setattr(text_data_scaling, "run_point", in_this_process)
    out = tmp_path / "out"
    flags = ["--rows", "400", "--formats", "jsonl", "--program", "--threads", "1", "--model", str(tiny_bert),
             "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)]
    assert text_data_scaling.main(flags) == 0
    header, rows = read_csv(out / "text_data_scaling.csv")
    program = ["program_first_step_s", "program_peak_rss_anon_mb", "program_peak_rss_anon_abs_mb"]
    assert {"rows", "format", "first_batch_s", "resume_s", "peak_rss_anon_mb", *program} <= set(header)
    assert [row["status"] for row in rows] == ["ok"]
    _positive_figures(rows, program)
    assert sorted(path.name for path in out.iterdir()) == ["text_data_scaling.csv"]
    assert (tmp_path / "data" / "rows-400.jsonl").exists() and not list((tmp_path / "data" / "runs").iterdir())
