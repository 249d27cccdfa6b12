"""The lengths of issue 40 through the program (tests/train/hostile_lengths_corpus.py): a length that leaves no
sampled text any of its tokens ends with USAGE and names the option and the smallest length that keeps text; a
length that costs some rows their text warns once with the count and trains. Each refusal is checked against the
tokenizer itself: at the smallest length the message names, the same run starts."""
from __future__ import annotations

import re

import pytest

from gradcache.cli import main
from tests.tiny_cross_encoder import write_tiny_cross_encoder
from tests.train.hostile_lengths_corpus import LENGTH_CASES, some_queries_without_tokens
from tests.train.test_hostile_corpus import statuses


def _run(case, tmp_path, tiny_bert, capsys) -> tuple[int, str, list[str]]:
    folder = tmp_path / "case"
    folder.mkdir()
    argv = case.build(folder, tiny_bert)
    status = main(argv)
    return status, capsys.readouterr().err, argv


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in LENGTH_CASES if c.status == "USAGE"])
def test_a_length_that_leaves_no_text_is_refused_naming_the_length_that_does(case, tmp_path, tiny_bert, capsys):
    status, err, argv = _run(case, tmp_path, tiny_bert, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == statuses()["USAGE"] and len(lines) == 1, err
    for fragment in case.fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not (tmp_path / "case" / "run").exists() or not any((tmp_path / "case" / "run").glob("*.pt"))
    option, smallest = re.search(r"give (--[a-z-]+) at least (\d+)", lines[0]).groups()
    if case.name.startswith("cross-encoder"):
        return  # the pairs' smallest length is checked against the tokenizer below: a run at it is slow
    # At the smallest length the message names, the same run trains: one text token is left.
    at = len(argv) - 1 - argv[::-1].index(option) if option in argv else None  # the last one given wins
    retried = [*argv[:at + 1], smallest, *argv[at + 2:]] if at is not None else [*argv, option, smallest]
    retried[retried.index("--output-dir") + 1] += "-retried"
    assert main([*retried, "--steps", "1"]) == 0, capsys.readouterr().err


def test_a_pairs_smallest_length_is_the_first_that_keeps_query_and_passage_text(tmp_path):
    """`lost_pairs`' smallest length against the cross-encoder's tokenizer itself: below it, some pair keeps no
    token of its query or of its passage (sequence ids); at it, every pair keeps both. Below the special tokens
    transformers does not truncate at all: every pair counts as lost there."""
    import transformers

    from gradcache.models.cross_encoder import weights_folder
    from gradcache.train.modes.text_lengths import lost_pairs

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(weights_folder(write_tiny_cross_encoder(tmp_path))))
    pairs = [("what is item 3", "item 3 is a thing numbered 3"), ("a", "item 4 is a thing numbered 4 of many")]
    smallest = lost_pairs(tokenizer, pairs, 64).smallest
    assert lost_pairs(tokenizer, pairs, 2).lost == len(pairs)  # below the special tokens: none truncates
    for length in range(smallest - 2, smallest + 3):
        batch = tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation=True, max_length=length)
        keep_both = all({0, 1} <= set(batch.sequence_ids(row)) for row in range(len(pairs)))
        assert keep_both == (length >= smallest), length
        assert (lost_pairs(tokenizer, pairs, length).lost == 0) == keep_both, length

def test_rows_that_lose_their_text_are_counted_in_one_warning_and_the_run_trains(tmp_path, tiny_bert, capsys):
    folder = tmp_path / "case"
    folder.mkdir()
    argv = some_queries_without_tokens(folder, tiny_bert)
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "sampled queries" in line]
    assert len(warnings) == 1, warnings
    lost, sampled = map(int, re.search(r"leaves (\d+) of (\d+) sampled queries", warnings[0]).groups())
    assert 0 < lost < sampled
    case, = (c for c in LENGTH_CASES if c.build is some_queries_without_tokens)
    assert all(fragment in warnings[0] for fragment in case.fragments), warnings[0]
