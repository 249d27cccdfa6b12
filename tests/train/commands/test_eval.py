"""`gradcache eval MODEL --data FILE` against a brute-force loop over a reference embedding of every text."""
import csv
import json

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.train.commands.conftest import (
    Reference,
    brute_force_metrics,
    distinct_passages,
    pair_rows,
)

METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


def _eval(capsys, *argv):
    capsys.readouterr()
    assert main(["eval", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def _expected(embed, rows, passages):
    queries = embed([row["query"] for row in rows])
    corpus = embed(passages)
    return brute_force_metrics(queries, corpus, [passages.index(row["positive"]) for row in rows])


def _check(got, want, rows, passages):
    for key in METRICS:
        assert got[key] == pytest.approx(want[key], abs=1e-9), key
    assert got["queries"] == len(rows) and got["corpus_size"] == len(passages)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["run", "exported"])
def test_a_run_folder_on_another_file(capsys, tmp_path, text_run, tiny_bert, pairs_file, folder):
    model = text_run if folder == "run" else text_run / "model"  # RUN/model: the sentence-transformers export
    got = _eval(capsys, str(model), "--data", str(pairs_file), "--negative-keys", "hard",
                "--output", str(tmp_path / "metrics.json"))
    rows, passages = pair_rows(), distinct_passages(pair_rows())
    assert len(passages) == 12  # every hard negative is another row's positive: one candidate each
    reference = Reference(tiny_bert, load_checkpoint(text_run)["model"], max_length=24)
    _check(got, _expected(reference, rows, passages), rows, passages)
    assert json.loads((tmp_path / "metrics.json").read_text()) == got


def test_a_hugging_face_folder_with_a_corpus_file(capsys, tmp_path, tiny_bert, pairs_file):
    rows = pair_rows()
    passages = [f"decoy passage number {i}." for i in range(5)] + [row["positive"] for row in rows]
    with open(tmp_path / "corpus.jsonl", "w") as handle:
        handle.writelines(json.dumps({"id": f"doc{i}", "text": text}) + "\n" for i, text in enumerate(passages))
    got = _eval(capsys, str(tiny_bert), "--data", str(pairs_file), "--corpus", str(tmp_path / "corpus.jsonl"))
    _check(got, _expected(Reference(tiny_bert), rows, passages), rows, passages)


def test_positives_given_as_corpus_ids(capsys, tmp_path, tiny_bert):
    rows = pair_rows()
    passages = [row["positive"] for row in rows][::-1]
    with open(tmp_path / "corpus.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "text"])
        writer.writerows([[f"p{i}", text] for i, text in enumerate(passages)])
    with open(tmp_path / "by_id.jsonl", "w") as handle:
        handle.writelines(json.dumps({"q": row["query"], "doc": f"p{passages.index(row['positive'])}"}) + "\n"
                          for row in rows)
    got = _eval(capsys, str(tiny_bert), "--data", str(tmp_path / "by_id.jsonl"), "--query-key", "q",
                "--positive-key", "doc", "--corpus", str(tmp_path / "corpus.csv"))
    _check(got, _expected(Reference(tiny_bert), rows, passages), rows, passages)


def test_the_packaged_minilm_equals_sentence_transformers(capsys, pairs_file):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from gradcache.models.huggingface_folder import PACKAGED_MODEL, model_folder

    got = _eval(capsys, PACKAGED_MODEL, "--data", str(pairs_file), "--negative-keys", "hard")
    rows, passages = pair_rows(), distinct_passages(pair_rows())
    model = sentence_transformers.SentenceTransformer(str(model_folder(PACKAGED_MODEL)), device="cpu")
    _check(got, _expected(lambda texts: model.encode(texts).astype("float64"), rows, passages), rows, passages)


def test_a_run_without_data_still_scores_its_own_held_out_split(capsys, text_run):
    trained = json.loads((text_run / "metrics.json").read_text())
    got = _eval(capsys, str(text_run))
    for key in METRICS:
        assert got[key] == pytest.approx(trained[key])
    assert got["steps"] == trained["steps"]


@pytest.mark.parametrize("case", ["folder without data", "unknown folder", "run without checkpoint", "empty data",
                                  "missing column", "corpus lacks positive", "bad output"])
def test_bad_input_exits_2_naming_it_and_writes_nothing(capsys, tmp_path, tiny_bert, pairs_file, case):
    output = tmp_path / "out" / "metrics.json"
    output.parent.mkdir()
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "notes.txt").write_text("hello")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_log.csv").write_text("step,loss\n")
    (tmp_path / "empty.tsv").write_text("query\tpositive\n")
    (tmp_path / "corpus.tsv").write_text("id\ttext\n1\tsomething else\n")
    argv, named = {
        "folder without data": ([str(tiny_bert)], "give --data"),
        "unknown folder": ([str(tmp_path / "unknown"), "--data", str(pairs_file)], "unknown kind"),
        "run without checkpoint": ([str(tmp_path / "run"), "--data", str(pairs_file)], "holds no checkpoint"),
        "empty data": ([str(tiny_bert), "--data", str(tmp_path / "empty.tsv")], "has no row"),
        "missing column": ([str(tiny_bert), "--data", str(pairs_file), "--query-key", "question"],
                           "no column 'question'"),
        "corpus lacks positive": ([str(tiny_bert), "--data", str(pairs_file), "--corpus", str(tmp_path / "corpus.tsv")],
                                  "neither a text nor an id of the corpus"),
        "bad output": ([str(tiny_bert), "--data", str(pairs_file), "--output", str(tmp_path / "out" / "m.txt")],
                       "unknown extension"),
    }[case]
    capsys.readouterr()
    assert main(["eval", *argv, *([] if "--output" in argv else ["--output", str(output)])]) == errors.USAGE
    assert named in capsys.readouterr().err
    assert list(output.parent.iterdir()) == []
