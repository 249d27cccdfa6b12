"""Smoke tests of the text benchmarks at tiny sizes: the quality experiment, the trainer throughput, the WordNet pairs,
and the frontier's text_outliers and clip_frozen workloads."""
from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest
import torch

from benchmarks import (
    frontier,
    mined_negatives,
    real_pairs,
    st_trainer_speed,
    text_quality,
)
from benchmarks.fresh_process import LIVE_TENSORS_ENV
from benchmarks.frontier_workloads import build_steps, sentences

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')


@pytest.mark.slow
def test_text_quality_trains_every_configuration_and_writes_csv_and_png(tmp_path: Path, tiny_bert, read_csv) -> None:
    flags = ["--model", str(tiny_bert), "--batch", "8", "--chunks", "2", "--gradcache-chunk", "4", "--steps", "1",
             "--seeds", "0", "--test-size", "8", "--max-length", "24", "--output-dir", str(tmp_path)]
    assert text_quality.main(flags) == 0
    header, rows = read_csv(tmp_path / "text_quality.csv")
    assert header == text_quality.COLUMNS
    finals = {(row["strategy"], row["chunk"]): row for row in rows if row["final"] == "True"}
    assert set(finals) == {("full", "8"), ("gradcache", "4"), ("naive", "2")}
    # what each run logs: the whole batch's 8 positives and 8 hard negatives less one, or one chunk's
    assert [finals[k]["negatives_per_anchor"] for k in sorted(finals)] == ["15", "15", "3"]
    _, summary = read_csv(tmp_path / "text_quality_summary.csv")
    assert len(summary) == 3 and (tmp_path / "text_quality.png").stat().st_size > 0


def test_st_trainer_speed_times_both_sides(tmp_path: Path, tiny_bert, read_csv) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("datasets")
    flags = ["--rounds", "1", "--steps-per-round", "1", "--output-dir", str(tmp_path), "--",
             "--model", str(tiny_bert), "--train-size", "16", "--batch-size", "8", "--chunk-size", "4",
             "--max-length", "24"]
    assert st_trainer_speed.main(flags) == 0
    header, rows = read_csv(tmp_path / "st_trainer_speed.csv")
    assert header == st_trainer_speed.COLUMNS
    assert [row["side"] for row in rows] == list(st_trainer_speed.SIDES)
    assert all(float(row["step_s"]) > 0 for row in rows) and float(rows[0]["ratio_to_st"]) > 0


DATA_NOUN = """  1 This software and database is being provided to you, the LICENSEE, by
00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived or known or inferred to have its own existence
00002000 05 n 02 aardvark 0 ant_bear 0 000 | nocturnal burrowing mammal of the grasslands of Africa; "an aardvark dug"
00003000 05 n 01 bank 0 000 | sloping land beside a body of water
00004000 05 n 01 bank 1 000 | a financial institution that accepts deposits and lends money
00005000 05 n 01 yes 0 000 | an affirmative
00006000 05 n 0a big_cat(a) 0 a 0 b 0 c 0 d 0 e 0 f 0 g 0 h 0 i 0 000 | any of several large cats of the wild
"""


def test_wordnet_pairs_are_single_meaning_nouns_and_their_glosses(tmp_path: Path) -> None:
    (tmp_path / "data.noun").write_text(DATA_NOUN)
    pairs = real_pairs.noun_definitions(tmp_path / "data.noun")
    assert pairs == [
        ("entity", "that which is perceived or known or inferred to have its own existence"),
        ("aardvark", 'nocturnal burrowing mammal of the grasslands of Africa; "an aardvark dug"'),
        ("big cat", "any of several large cats of the wild"),  # w_cnt is hexadecimal; markers dropped
    ]  # 'bank' has two meanings, 'yes' a gloss too short to retrieve by


def test_real_pairs_without_wordnet_exits_2(tmp_path: Path, capsys) -> None:
    assert real_pairs.main(["--wordnet", str(tmp_path), "--output-dir", str(tmp_path / "out")]) == 2
    assert "apt-get install wordnet-base" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_real_pairs_only_writes_the_sampled_pairs_and_trains_nothing(tmp_path: Path) -> None:
    (tmp_path / "data.noun").write_text(DATA_NOUN)
    out = tmp_path / "out"
    assert real_pairs.main(["--wordnet", str(tmp_path), "--pairs", "2", "--seed", "3", "--pairs-only",
                            "--output-dir", str(out)]) == 0
    with open(out / "wordnet_nouns.tsv", newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    every = real_pairs.noun_definitions(tmp_path / "data.noun")
    assert rows[0] == ["query", "positive"]
    assert [tuple(row) for row in rows[1:]] == random.Random(3).sample(every, 2)
    assert sorted(path.name for path in out.iterdir()) == ["wordnet_nouns.tsv"]


def test_mined_negatives_splits_a_pairs_file_into_a_seeded_disjoint_sample(tmp_path: Path) -> None:
    rows = [(f"word {i}", f"its definition number {i}") for i in range(30)]
    lines = ["query\tpositive", *(f"{q}\t{p}" for q, p in rows), f"{rows[0][0]}\t{rows[0][1]}"]  # one repeat
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n")
    args = mined_negatives.get_args_parser().parse_args(["--data", str(tmp_path / "pairs.tsv"), "--train-size",
                                                         "20", "--test-size", "10", "--data-seed", "4"])
    train, test = mined_negatives._file_pairs(args)
    assert len(train) == 20 and len(test) == 10  # all 30 distinct rows, the repeat counted once
    assert [tuple(row) for row in test + train] == random.Random(4).sample(rows, 30)
    args.train_size = 21
    with pytest.raises(SystemExit, match="30 distinct rows"):
        mined_negatives._file_pairs(args)


def test_text_outliers_have_one_long_row_in_ten() -> None:
    words = [len(t.split()) for t in sentences(400, lengths="outliers")]
    short = sorted(words)[len(words) // 2]
    long = sum(w > 4 * short for w in words)
    assert 20 <= long <= 60  # about one in ten, each several times the median
    with pytest.raises(ValueError, match="lengths='uniform'"):
        sentences(4, lengths="uniform")


def test_clip_frozen_runs_its_three_configurations(tmp_path: Path, read_csv) -> None:
    settings = {"workload": "clip_frozen", "batch": 8, "chunk": 4, "chunk_tokens": None, "image_size": 8,
                "max_length": 8, "threads": 0, "device": "cpu", "memory_budget_gb": 0}
    steps, _ = build_steps(settings, torch.device("cpu"))
    assert list(steps) == ["image_nograd", "text_alone", "frozen_tower"]
    flags = ["--workload", "clip_frozen", "--batch", "8", "--chunk", "4", "--image-size", "8", "--max-length", "8",
             "--rounds", "1", "--threads", "0", "--only", "time", "--output-dir", str(tmp_path)]
    assert frontier.main(flags) == 0
    _, rows = read_csv(tmp_path / "frontier_clip_frozen.csv")
    assert [row["config"] for row in rows] == ["image_nograd", "text_alone", "frozen_tower"]


def test_a_failed_memory_point_makes_the_frontier_exit_1(tmp_path: Path, monkeypatch, capsys) -> None:
    environments = []

    def failed(module, point, budget, env=None):
        environments.append(env)
        return {"status": "error", "error": "ValueError: boom"}

    monkeypatch.setattr(frontier, "run_point", failed)
    flags = ["--workload", "simclr", "--batch", "8", "--chunk", "4", "--image-size", "8", "--rounds", "1",
             "--threads", "0", "--only", "memory", "--configs", "naive", "--output-dir", str(tmp_path)]
    assert frontier.main(flags) == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err and "FAILED memory points: naive (error)" in err
    assert (tmp_path / "frontier_simclr.csv").exists()
    assert environments == [LIVE_TENSORS_ENV]  # a point without a budget counts live tensors, not heap fragments


@pytest.mark.slow
def test_the_full_graph_is_measured_in_its_own_process_and_given_to_the_budget_points(tmp_path, monkeypatch) -> None:
    points, environments = [], []
    real = frontier.run_point

    def recorded(module, point, budget, env=None):
        points.append(point)
        environments.append(env)
        return real(module, point, budget, env)

    monkeypatch.setattr(frontier, "run_point", recorded)
    flags = ["--workload", "simclr", "--batch", "8", "--chunk", "4", "--image-size", "8", "--rounds", "1",
             "--threads", "0", "--only", "memory", "--configs", "budget_50", "--output-dir", str(tmp_path)]
    assert frontier.main(flags) == 0
    assert [p["config"] for p in points] == ["graph_bytes", "budget_50"]
    assert environments[1:] == [LIVE_TENSORS_ENV]  # memory points count live tensors, not heap fragments
    settings = {**points[0], "config": None}
    _, info = build_steps(settings, torch.device("cpu"), only="graph_bytes")
    assert points[1]["graph_bytes"] == info["graph_bytes"]["graph_bytes"] > 0  # the same workload, the same bytes
