"""`gradcache train text --eval-data` (held-out rows given apart) and `--corpus` (passages named by id, also the
retrieval corpus of the evaluation), on a tiny BERT: the step-0 scores against a reference evaluation computed here."""
import json

import numpy as np
import pytest
import torch
from gradcache.models import BiEncoder, HuggingFaceEncoder, HuggingFaceTokenizer

from gradcache.cli import main
from gradcache.train.data.text.corpus import read_corpus
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.indexed_pairs import IndexedPairs
from gradcache.train.data.text.sources import read_text_pairs
from gradcache.train.data.text.text_pairs import split_pairs
from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.eval.retrieval import evaluate_retrieval, retrieval_corpus
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
WORDS = ["red", "blue", "tall", "short", "baker", "pilot", "river", "stone", "lamp", "song", "north", "glass"]


def _text(i, length):
    return " ".join(WORDS[(i * 7 + k * 3 + k * k) % len(WORDS)] for k in range(length)) + f" {i}"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _initial_scores(model_folder, pairs, corpus=None):
    """The reference: the untrained model (as the run loads it) scoring `pairs` (and `corpus`) directly."""
    torch.manual_seed(0)
    model = BiEncoder(HuggingFaceEncoder(model_folder)).eval()
    tokenizer = HuggingFaceTokenizer(model_folder, 24)
    with torch.no_grad():
        return evaluate_retrieval(model.encode_query, model.encode_passage, tokenizer, pairs, torch.device("cpu"),
                                  corpus=corpus)


def test_eval_data_is_the_held_out_set(tmp_path, tiny_bert):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"query": _text(i, 4), "positive": _text(i, 9)}
                                                    for i in range(24)])
    held_out = _write_jsonl(tmp_path / "eval.jsonl", [{"query": _text(100 + i, 4), "positive": _text(100 + i, 9)}
                                                      for i in range(10)])
    assert main(text_args(tiny_bert, tmp_path / "run", "--data", str(train), "--eval-data", str(held_out))) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train_size"] == 24 and metrics["test_size"] == 10  # no --test-size rows taken from --data
    reference = _initial_scores(tiny_bert, read_text_pairs(held_out))
    for key, value in reference.items():
        assert metrics["step0"][key] == pytest.approx(value, abs=1e-6), key


def _corpus_files(tmp_path, missing=False):
    passages = [{"id": f"d{i}", "text": _text(i, 9)} for i in range(40)]
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", passages[::-1])  # not in the rows' order
    rows = [{"query": _text(i, 4), "positive_id": f"d{i}", "negative_ids": [f"d{(i + 5) % 40}"]} for i in range(32)]
    if missing:
        rows[7]["negative_ids"] = ["d999"]
    return corpus, _write_jsonl(tmp_path / "rows.jsonl", rows), passages, rows


def test_rows_naming_passages_by_id_read_the_corpus_texts(tmp_path):
    corpus_file, rows_file, passages, rows = _corpus_files(tmp_path)
    corpus = read_corpus(*data_files(corpus_file), "corpus.jsonl")
    assert len(corpus) == 40 and corpus.position("d999") is None and corpus.text("d3") == _text(3, 9)
    indexed = IndexedPairs(build_row_index([rows_file], ".jsonl", "query", "positive_id", ["negative_ids"],
                                           corpus=corpus), corpus=corpus)
    texts = {passage["id"]: passage["text"] for passage in passages}
    assert [indexed.row(i) for i in range(len(indexed))] == [
        (row["query"], texts[row["positive_id"]], [texts[row["negative_ids"][0]]]) for row in rows]
    assert sorted(corpus[p] for p in range(len(corpus))) == sorted(texts.values())
    assert [corpus[p] for p in indexed.positive_positions()] == [texts[row["positive_id"]] for row in rows]


def test_a_corpus_run_retrieves_from_the_whole_corpus(tmp_path, tiny_bert):
    corpus_file, rows_file, passages, _ = _corpus_files(tmp_path)
    assert main(text_args(tiny_bert, tmp_path / "run", "--data", str(rows_file), "--corpus", str(corpus_file))) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train_size"] == 16 and metrics["test_size"] == 16
    assert metrics["negatives_per_anchor"] == 8 * 2 - 1  # h = 1 from negative_ids
    # the reference: the held-out queries (the run's own split) against all 40 passages, in the order the run
    # embeds them (a tiny random BERT scores many passages within float32 rounding of each other: the order of a
    # batch may swap their ranks)
    held_out = split_pairs(read_text_pairs(rows_file, "query", "positive_id", ["negative_ids"]), 16, 0, "t").test
    corpus = read_corpus(*data_files(corpus_file), "corpus.jsonl")
    texts = [corpus[p] for p in range(len(corpus))]
    assert sorted(texts) == sorted(passage["text"] for passage in passages)
    by_id = {passage["id"]: passage["text"] for passage in passages}
    held_out.positives = [by_id[passage_id] for passage_id in held_out.positives]
    relevant = np.array([texts.index(positive) for positive in held_out.positives])
    reference = _initial_scores(tiny_bert, held_out, corpus=(texts, relevant))
    assert reference != _initial_scores(tiny_bert, held_out)  # the corpus makes a difference to the scores
    for key, value in reference.items():
        assert metrics["step0"][key] == pytest.approx(value, abs=1e-6), key
    assert len(retrieval_corpus(held_out)[0]) < 40


def test_bad_eval_data_and_corpus_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys):
    corpus_file, rows_file, _, _ = _corpus_files(tmp_path, missing=True)
    out = tmp_path / "out"
    cases = [(["--data", str(rows_file), "--corpus", str(corpus_file)], ["rows.jsonl line 8", "'d999'", "--corpus"]),
             (["--data", str(rows_file), "--corpus", str(tmp_path / "nope-*.jsonl")], ["--corpus", "matches no file"]),
             (["--eval-data", str(tmp_path / "missing.jsonl")], ["--eval-data", "missing.jsonl", "is not a file"]),
             (["--corpus", str(corpus_file)], ["--corpus", "built in"])]
    for options, fragments in cases:
        assert main(text_args(tiny_bert, out, *options)) == 2
        stderr = capsys.readouterr().err
        for fragment in fragments:
            assert fragment in stderr, (fragment, stderr)
    assert not out.exists()
