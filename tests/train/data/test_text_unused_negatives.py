"""Rows that hold a column named like hard negatives (`negative`, `negatives`, `negative_1` ...) that no
`--negative-keys` names train without them: a warning says so once, naming the option that would use them (no
refusal, the defaults stay). Sentence-transformers' triplets (anchor, positive, negative) meet it first."""
import gzip
import json
import warnings

import pytest

from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.data.text.streamed_rows import read_streamed_rows
from gradcache.train.data.text.formats import format_named

ROWS = [{"query": f"q{i}", "positive": f"p{i}", "negative": f"n{i}"} for i in range(4)]


def _jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_an_unnamed_negative_column_warns_once_naming_the_option(tmp_path):
    path = _jsonl(tmp_path / "triplets.jsonl")
    with pytest.warns(UserWarning) as caught:
        index = build_row_index([path], ".jsonl")
    named = [w for w in caught if "--negative-keys negative" in str(w.message)]
    assert len(named) == 1 and str(path) in str(named[0].message) and "'negative'" in str(named[0].message)
    assert index.row(0) == ("q0", "p0", [])  # trained without them: the defaults stay


def test_numbered_negative_columns_of_a_table_are_all_named(tmp_path):
    path = tmp_path / "triplets.csv"
    path.write_text("query,positive,negative_1,negative_2\nq,p,n1,n2\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="--negative-keys negative_1 negative_2"):
        build_row_index([path], ".csv")


def test_a_stream_warns_too(tmp_path):
    path = tmp_path / "triplets.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in ROWS).encode()))
    with pytest.warns(UserWarning, match="--negative-keys negative"):
        read_streamed_rows(format_named(".jsonl.gz"), [path], ("query", "positive", ()), None)


def test_no_warning_once_the_column_is_named_or_absent(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_row_index([_jsonl(tmp_path / "named.jsonl")], ".jsonl", negative_keys=["negative"])
        plain = [{"query": row["query"], "positive": row["positive"]} for row in ROWS]
        build_row_index([_jsonl(tmp_path / "pairs.jsonl", plain)], ".jsonl")
