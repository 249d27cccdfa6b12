"""`gradcache train text` on streamed `.jsonl.gz` rows, through main([...]) on the tiny BERT: bad rows and a
truncated file skipped and counted in metrics.json, the counted epoch recorded in the run, `gradcache eval` on a
.jsonl.gz scoring as on the same rows in plain .jsonl, --max-bad-share as the run goes (exit 4), and bad input
refused with exit 2 before anything is written. (The resume: test_text_mode.py's resume cases.)"""
import gzip
import json

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.data import bad_data
from gradcache.train.data.streams import Damaged
from gradcache.train.data.text.formats.jsonl_gz import JSONL_GZ
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
WORDS = ["red", "blue", "tall", "short", "baker", "pilot", "river", "stone", "lamp", "song", "north", "glass"]


def _row(i):
    words = [WORDS[(i * 5 + k * k) % len(WORDS)] for k in range(6)]
    return {"query": f"who is the {words[0]} {words[1]} {i}?", "positive": f"{i} is a {' '.join(words[2:])}"}


def _lines(rows):
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows).encode()


def _gzip(path, rows):
    path.write_bytes(gzip.compress(_lines(rows)))
    return path


def test_a_streamed_run_counts_bad_rows_records_its_epoch_and_eval_reads_gzip(tmp_path, tiny_bert, capsys):
    train = tmp_path / "train"
    train.mkdir()
    _gzip(train / "a.jsonl.gz", [*map(_row, range(10)), "not json", {"query": "", "positive": "p"},
                                 *map(_row, range(10, 20))])
    cut = gzip.compress(_lines([_row(99)]))[:6]  # a second gzip member cut in its header: the file is truncated
    (train / "b.jsonl.gz").write_bytes(gzip.compress(_lines(map(_row, range(20, 32)))) + cut)
    held = [_row(i) for i in range(100, 116)]
    (tmp_path / "held.jsonl").write_bytes(_lines(held))
    _gzip(tmp_path / "held.jsonl.gz", held)
    run = tmp_path / "run"  # 32 usable rows, batch 16: one epoch reads every line once
    assert main(text_args(tiny_bert, run, "--data", str(train), "--eval-data", str(tmp_path / "held.jsonl.gz"),
                          "--batch-size", "16", "--chunk-size", "8")) == errors.OK
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["train_size"], metrics["test_size"], metrics["skipped_rows"]) == (32, 16, 3)
    assert load_checkpoint(run)["args"]["train_num_samples"] == 32  # counted once: a resume reads it from here
    scores = []
    for argv in (["eval", str(run)], *(["eval", str(run), "--data", str(tmp_path / name)]
                                       for name in ("held.jsonl.gz", "held.jsonl"))):
        capsys.readouterr()
        assert main(argv) == errors.OK
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[0]["mrr@10"] == pytest.approx(metrics["mrr@10"])
    assert scores[1] == scores[2]


def test_more_bad_rows_than_max_bad_share_allows_stop_the_run_with_exit_4(tmp_path, tiny_bert, capsys, monkeypatch):
    monkeypatch.setattr(bad_data, "BAD_SHARE_MIN_READS", 8)
    data = _gzip(tmp_path / "rows.jsonl.gz", [row for i in range(32) for row in (_row(i), "not json")])
    held = _gzip(tmp_path / "held.jsonl.gz", [_row(i) for i in range(100, 108)])
    assert main(text_args(tiny_bert, tmp_path / "run", "--data", str(data), "--eval-data", str(held),
                          "--max-bad-share", "0.1")) == errors.DATA_ERROR
    error = capsys.readouterr().err
    assert "rows read so far" in error and "could not be used" in error and "--max-bad-share 0.1" in error


def test_bad_gzip_input_exits_2_and_writes_nothing(tmp_path, tiny_bert, capsys):
    data = _gzip(tmp_path / "rows.jsonl.gz", [{"query": f"q{i}", "positive_id": f"d{i % 4}",
                                               "negative_ids": [f"d{(i + 1) % 3}"]} for i in range(24)])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_lines([{"id": f"d{i}", "text": f"passage {i}"} for i in range(3)]))  # no d3
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.jsonl").write_bytes(_lines(map(_row, range(12))))
    _gzip(mixed / "b.jsonl.gz", map(_row, range(12, 24)))
    plain = tmp_path / "rows.jsonl"
    plain.write_bytes(_lines(map(_row, range(24))))
    out = tmp_path / "out"
    cases = [(["--data", str(mixed)], ["mixes formats", ".jsonl.gz"]),
             (["--data", str(data), "--corpus", str(_gzip(tmp_path / "corpus.jsonl.gz", []))],
              ["--corpus", "decompress it"]),
             (["--data", str(plain), "--train-num-samples", "10"], ["--train-num-samples", "not .jsonl.gz"]),
             (["--data", str(data), "--corpus", str(corpus), "--test-size", "1"],
              ["rows.jsonl.gz line 4", "'d3'", "--corpus"]),
             (["--data", str(plain), "--test-size", "24"], ["--test-size", "24"]),  # the indexed rows' own check
             (["--data", str(_gzip(tmp_path / "pairs.jsonl.gz", map(_row, range(24)))), "--test-size", "24"],
              ["--test-size 24 takes every row"])]
    for options, fragments in cases:
        assert main(text_args(tiny_bert, out, *options)) == errors.USAGE
        stderr = capsys.readouterr().err
        for fragment in fragments:
            assert fragment in stderr, (fragment, stderr)
    assert not out.exists()


def test_a_truncated_gzip_with_fewer_rows_than_the_batch_names_the_damage(tmp_path, tiny_bert, capsys):
    whole = gzip.compress(_lines(map(_row, range(400))))
    data = tmp_path / "cut.jsonl.gz"
    data.write_bytes(whole[:len(whole) // 2])  # cut mid-stream: the rows before the cut still read
    held = _gzip(tmp_path / "held.jsonl.gz", [_row(i) for i in range(500, 508)])
    readable = sum(1 for unit in JSONL_GZ.lines(str(data)) if not isinstance(unit, Damaged))
    assert 16 <= readable < 400
    out = tmp_path / "out"
    assert main(text_args(tiny_bert, out, "--data", str(data), "--eval-data", str(held),
                          "--batch-size", str(readable + 1))) == errors.USAGE
    error = capsys.readouterr().err
    for fragment in (f"--batch-size {readable + 1} exceeds the {readable} training rows",
                     f"{data} (unreadable after line {readable}, truncated or damaged: Compressed file ended",
                     "`gunzip -t FILE` checks it", "repair or replace it"):
        assert fragment in error, (fragment, error)
    assert not out.exists()
