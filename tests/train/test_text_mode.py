"""`gradcache train text` through main([...]) on a tiny BERT written by the test: no download, seconds per run."""
import csv
import gzip
import json
import random
import string

import pytest
import torch

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.tiny_text_model import write_tiny_bert
from tests.train.conftest import TINY, text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.parametrize("towers", [[], ["--separate-towers"]], ids=["shared", "separate"])
@pytest.mark.parametrize("hard", ["0", "2"])
def test_towers_and_hard_negatives(tmp_path, tiny_bert, towers, hard, capsys):
    assert main(text_args(tiny_bert, tmp_path, "--negatives-per-query", hard, *towers)) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["skipped_rows"] == 0
    assert metrics["negatives_per_anchor"] == 8 * (1 + int(hard)) - 1
    for key in METRICS:
        assert 0 <= metrics[key] <= 100 and 0 <= metrics[f"{key}_initial"] <= 100
    with open(tmp_path / "eval_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == [0, 2]
    assert float(rows[0]["mrr@10"]) == pytest.approx(metrics["mrr@10_initial"])
    state = load_checkpoint(tmp_path)["model"]
    assert any(name.startswith("towers.1.") for name in state) == bool(towers)
    assert json.loads(capsys.readouterr().out)["steps"] == 2


@pytest.mark.parametrize("strategy", ["naive", "full"])
def test_every_strategy(tmp_path, tiny_bert, strategy):
    assert main(text_args(tiny_bert, tmp_path, "--strategy", strategy, "--separate-towers", "--symmetric")) == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 2


def test_gradcache_and_full_batch_train_the_same_model(tmp_path, tiny_bert):
    for strategy in ("gradcache", "full"):
        assert main(text_args(tiny_bert, tmp_path / strategy, "--strategy", strategy, "--steps", "3")) == 0
    cached, full = (load_checkpoint(tmp_path / s)["model"] for s in ("gradcache", "full"))
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def dropout_bert(tmp_path_factory):
    """A tiny BERT with dropout 0.1, as MiniLM has: a resume that shifts the random state changes its losses."""
    return write_tiny_bert(tmp_path_factory.mktemp("models") / "dropout_bert", dropout=0.1)


def _random_pairs(path, rows, seed=0):
    """A JSONL file of `rows` rows: a query of 5-10 random words, a positive and a `negative` passage of 10-20."""
    generator = random.Random(seed)
    words = ["".join(generator.choices(string.ascii_lowercase, k=generator.randint(3, 8))) for _ in range(200)]

    def text(low, high):
        return " ".join(generator.choices(words, k=generator.randint(low, high)))

    path.write_text("".join(json.dumps({"query": text(5, 10), "positive": text(10, 20), "negative": text(10, 20)})
                            + "\n" for _ in range(rows)), encoding="utf-8")
    return path


# name: (model, options, the step after which the first run is killed); 32 rows, 16 held out
RESUMES = {
    "hard-negatives": ("dropout", ["--negative-keys", "negative", "--steps", "5", "--checkpoint-every", "2"], 3),
    "in-batch": ("dropout", ["--steps", "5", "--checkpoint-every", "2"], 3),  # 2 steps per epoch: crosses two
    # the packaged model (dropout 0.1) at its smallest: its second step resumed from the checkpoint of its first
    "minilm": ("all-MiniLM-L6-v2", ["--negative-keys", "negative", "--steps", "2", "--checkpoint-every", "1",
                                    "--batch-size", "4", "--chunk-size", "4", "--max-length", "8", "--test-size", "4"], 2),
    # the same rows gzipped and streamed (data/streams.py): resumed in the middle of epoch 0, crossing into 1
    "jsonl.gz": ("dropout", ["--negative-keys", "negative", "--steps", "3", "--checkpoint-every", "1"], 2),
}
GZIPPED = ("jsonl.gz",)  # the cases whose data is pairs.jsonl.gz


def _gzipped(path):
    """`path` compressed beside it as PATH.gz."""
    gzipped = path.with_name(path.name + ".gz")
    gzipped.write_bytes(gzip.compress(path.read_bytes()))
    return gzipped


@pytest.mark.parametrize("case", [case if case == "in-batch" else pytest.param(case, marks=pytest.mark.slow)
                                  for case in RESUMES])
def test_resume_logs_the_same_losses_as_an_uninterrupted_run(tmp_path, dropout_bert, killed_after_step, case):
    """Killed after step k (the checkpoint holds an earlier one), resumed: the same losses, weights and scores as
    one whole run, with dropout on, so the resumed steps must draw from the checkpoint's random state."""
    model, options, killed = RESUMES[case]
    model = str(dropout_bert) if model == "dropout" else model
    data = _random_pairs(tmp_path / "pairs.jsonl", 32)
    data = _gzipped(data) if case in GZIPPED else data
    argv = ["train", "text", *TINY["text"], "--max-length", "16", "--model", model, "--data", str(data), *options]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0

    killed_after_step(killed, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert load_checkpoint(tmp_path / "cut")["step"] < killed
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d)["model"] for d in ("whole", "cut"))
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    final = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut")]
    assert final[0]["mrr@10"] == final[1]["mrr@10"] and final[0]["mrr@10_initial"] == final[1]["mrr@10_initial"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["jsonl", pytest.param("datasets", marks=pytest.mark.slow)])
def test_a_resume_reads_the_saved_row_index_not_the_data(tmp_path, dropout_bert, killed_after_step, monkeypatch,
                                                         source):
    """A streamed JSONL (and a memory-mapped datasets folder): the run saves its row index (RUN/data_index.npz)
    beside the run; killed and resumed, it reuses it (indexing again fails here) and logs the losses of the
    uninterrupted run."""
    from gradcache.train.data.text import sources

    data = _random_pairs(tmp_path / "pairs.jsonl", 32)
    if source == "datasets":
        import datasets

        rows = [json.loads(line) for line in data.read_text().splitlines()]
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "pairs"))  # no cache of its own
        data = tmp_path / "pairs"
    argv = ["train", "text", *TINY["text"], "--max-length", "16", "--model", str(dropout_bert), "--data", str(data),
            "--negative-keys", "negative", "--steps", "5", "--checkpoint-every", "2"]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    killed_after_step(3, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert (tmp_path / "cut" / sources.DATA_INDEX).is_file()

    def indexing_again(*args, **kwargs):
        raise AssertionError("the resume indexed the data again")

    monkeypatch.setattr(sources, "build_row_index", indexing_again)
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    if source == "datasets":
        return
    data.write_text(data.read_text() + data.read_text())  # the file changed: its saved index no longer holds
    with pytest.raises(AssertionError, match="indexed the data again"):
        main(["train", "text", "--resume", str(tmp_path / "cut"), "--steps", "6", "--quiet"])


def test_a_quiet_resume_prints_no_loading_bar(tmp_path, tiny_bert, capsys):
    """A resume rebuilds the model before any check: transformers' "Loading weights" bar stays off there too."""
    import transformers

    assert main(text_args(tiny_bert, tmp_path, "--steps", "1")) == 0
    transformers.utils.logging.enable_progress_bar()  # as in a new process: the run above turned it off
    capsys.readouterr()
    assert main(["train", "text", "--resume", str(tmp_path), "--steps", "2", "--quiet"]) == 0
    stderr = capsys.readouterr().err
    assert "extended from 1 to 2 steps" in stderr  # what a quiet resume still says
    assert "Loading weights" not in stderr and "it/s]" not in stderr


def test_eval_subcommand_reproduces_the_final_metrics(tmp_path, tiny_bert, capsys):
    assert main(text_args(tiny_bert, tmp_path)) == 0
    trained = json.loads((tmp_path / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(tmp_path)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for key in METRICS:
        assert evaluated[key] == pytest.approx(trained[key])
    assert evaluated["mrr@10_initial"] == trained["mrr@10_initial"]


def test_a_pairs_file_with_skipped_rows(tmp_path, tiny_bert):
    rows = [{"question": f"who is number {i}?", "answer": f"number {i} is here", "hard": f"number {i + 1} is not"}
            for i in range(40)]
    rows[5]["question"] = ""
    rows[9]["answer"] = " "
    with open(tmp_path / "pairs.jsonl", "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    with pytest.warns(UserWarning, match="skipped 2 of 40 rows"):
        assert main(text_args(tiny_bert, tmp_path / "run", "--data", str(tmp_path / "pairs.jsonl"), "--query-key",
                          "question", "--positive-key", "answer", "--negative-keys", "hard")) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["skipped_rows"] == 2 and metrics["train_size"] + metrics["test_size"] == 38
    assert metrics["negatives_per_anchor"] == 8 * 2 - 1


def _fails(argv, capsys, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_models_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys):
    out = tmp_path / "out"
    _fails(text_args(tmp_path / "nowhere", out), capsys, "--model", "nowhere", "no such folder")
    (tmp_path / "not_hf").mkdir()
    (tmp_path / "not_hf" / "weights.bin").write_bytes(b"0")
    _fails(text_args(tmp_path / "not_hf", out), capsys, "no config.json")
    untokenized = write_tiny_bert(tmp_path / "untokenized")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (untokenized / name).unlink(missing_ok=True)
    _fails(text_args(untokenized, out), capsys, "holds no tokenizer")
    _fails(text_args(tiny_bert, out, "--max-length", "1"), capsys, "--max-length")
    assert not out.exists()


def test_bad_data_exits_2_and_writes_nothing(tmp_path, tiny_bert, capsys):
    out = tmp_path / "out"
    (tmp_path / "pairs.tsv").write_text("query\tpositive\n" + "q\tp\n" * 3)
    _fails(text_args(tiny_bert, out, "--data", str(tmp_path / "pairs.tsv"), "--positive-key", "answer"), capsys,
           "no column 'answer'", "--positive-key")
    _fails(text_args(tiny_bert, out, "--data", str(tmp_path / "missing.tsv")), capsys, "missing.tsv", "is not a file")
    _fails(text_args(tiny_bert, out, "--data", str(tmp_path / "pairs.tsv"), "--test-size", "3"), capsys, "--test-size")
    _fails(text_args(tiny_bert, out, "--data", str(tmp_path / "pairs.tsv"), "--test-size", "1"), capsys,
           "--batch-size 8 exceeds the 2 training rows")
    _fails(text_args(tiny_bert, out, "--negatives-per-query", "-1"), capsys, "--negatives-per-query")
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("options", [["--precision", "bf16", "--grad-checkpointing", "--tile-size", "4"],
                                     ["--fsdp", "--separate-towers"]], ids=["bf16-checkpointing-tiles", "fsdp"])
def test_precision_checkpointing_tiles_and_sharding(tmp_path, tiny_bert, options):
    assert main(text_args(tiny_bert, tmp_path, *options)) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and 0 <= metrics["mrr@10"] <= 100
    assert (tmp_path / ("last.dcp" if "--fsdp" in options else "last.pt")).exists()


def test_missing_transformers_exits_2(tmp_path, tiny_bert, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    _fails(text_args(tiny_bert, tmp_path / "out"), capsys, "pip install 'gradcache[text]'")
    assert not (tmp_path / "out").exists()
