"""The default held-out size (data/held_out.py): a tenth of a small file, at most the cap of its kind, the
built-in data sets' sizes unchanged, an explicit --test-size honoured; and the README's text command on a
302-row file of one's own trains with the defaults."""
import json

import pytest

from gradcache.cli import main
from gradcache.train.data.held_out import DEFAULT_MOST, held_out_size
from gradcache.train.data.text.text_pairs import TextPairs, split_pairs
from tests.train.conftest import TINY


@pytest.mark.parametrize("items", ["rows", "images"])
@pytest.mark.parametrize("count", [1, 9, 10, 302, 2999, 3000, 10 ** 6])
def test_default_is_a_tenth_at_most_the_cap(items, count):
    expected = min(DEFAULT_MOST[items], max(1, count // 10))
    assert held_out_size(None, count, items) == expected
    assert held_out_size(None, count, items) <= max(1, count / 4)


def test_built_in_and_streamed_keep_the_cap_and_a_given_size_is_honoured():
    assert held_out_size(None, None, "rows") == 300  # the built-in world's figures
    assert held_out_size(None, None, "images") == 2048  # shapes'
    assert held_out_size(300, 302, "rows") == 300
    assert held_out_size(7, None, "images") == 7


def test_split_pairs_holds_out_the_default():
    pairs = TextPairs([f"q{i}" for i in range(302)], [f"p{i}" for i in range(302)], [[] for _ in range(302)])
    splits = split_pairs(pairs, None, seed=0, name="small")
    assert len(splits.test) == 30 and len(splits.train) == 272
    assert sorted(splits.test.queries + splits.train.queries) == sorted(pairs.queries)


def _own_file(path, rows):
    path.write_text("".join(json.dumps({"question": f"what is item {i} about", "answer": f"item {i} is about "
                                        f"topic {i % 17}", "negatives": [f"unrelated {i * 7 % 301}"]}) + "\n"
                            for i in range(rows)))
    return path


def _without(args, *names):
    """`args` without the options `names` and their values."""
    kept, skip = [], False
    for token in args:
        if skip:
            skip = False
        elif token in names:
            skip = True
        else:
            kept.append(token)
    return kept


@pytest.mark.slow  # a whole run, about a second
def test_readme_text_command_trains_on_a_small_file(tmp_path, tiny_bert):
    """The README's flags, the default --batch-size and --test-size; tiny model settings."""
    data = _own_file(tmp_path / "pairs.jsonl", 302)
    tiny = _without(TINY["text"], "--train-size", "--test-size", "--batch-size", "--chunk-size")
    argv = ["train", "text", "--model", str(tiny_bert), *tiny, "--steps", "1", "--output-dir", str(tmp_path / "run"),
            "--data", str(data), "--query-key", "question", "--positive-key", "answer", "--negative-keys", "negatives"]
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test_size"] <= 302 / 4 and metrics["train_size"] + metrics["test_size"] == 302


def test_too_few_rows_for_a_batch_names_test_size(tmp_path, tiny_bert, capsys):
    data = _own_file(tmp_path / "pairs.jsonl", 40)
    argv = ["train", "text", "--model", str(tiny_bert), *_without(TINY["text"], "--train-size", "--test-size",
            "--batch-size"), "--batch-size", "32", "--test-size", "20", "--output-dir", str(tmp_path / "run"),
            "--data", str(data), "--query-key", "question", "--positive-key", "answer"]
    assert main(argv) == 2
    message = capsys.readouterr().err
    assert "--test-size 20 held out 20" in message and "20 training rows" in message and "--batch-size 32" in message
