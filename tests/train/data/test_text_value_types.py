"""A text field holds text (or nothing), in every format: a number, a list in a query or positive column, a
mapping or a boolean is not turned into text with str(); its row is skipped and counted, the reason naming the
column and the type. Of the issue's Parquet file (an int query, a list positive, a null negative) no row trains."""
import json

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.data.text.row_index import build_row_index
from tests.train.conftest import text_args

GOOD = {"query": "who is one?", "positive": "one is a number", "negative": "two is a number"}


@pytest.mark.parametrize("field, value, named", [
    ("query", 7, "column 'query' holds int"),
    ("positive", ["a", "b"], "column 'positive' holds list"),
    ("negative", {"text": "x"}, "column 'negative' holds dict"),
    ("query", True, "column 'query' holds bool"),
    ("negative", ["fine", 3.5], "column 'negative' holds a list with float"),
])
def test_a_field_that_is_not_text_skips_its_row_naming_column_and_type(tmp_path, field, value, named):
    path = tmp_path / "pairs.jsonl"
    rows = [GOOD, {**GOOD, field: value}, GOOD]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.warns(UserWarning, match="skipped 1 of 3 rows") as caught:
        index = build_row_index([path], ".jsonl", negative_keys=["negative"], negatives_per_query=1)
    assert len(index) == 2 and index.row(1) == (GOOD["query"], GOOD["positive"], [GOOD["negative"]])
    assert f"line 2: {named}, not text" in str(caught[0].message)


def test_a_null_negative_is_an_empty_one_and_a_list_of_texts_is_negatives(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{**GOOD, "negative": None}, {**GOOD, "negative": ["n1", None, "n2"]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    index = build_row_index([path], ".jsonl", negative_keys=["negative"], negatives_per_query=0, warn=False)
    assert [index.row(i) for i in range(2)] == [(GOOD["query"], GOOD["positive"], [])] * 2


def test_the_issues_parquet_file_trains_on_nothing_and_says_why(tmp_path, tiny_bert, capsys):
    pyarrow = pytest.importorskip("pyarrow")
    from pyarrow import parquet

    count = 48
    table = pyarrow.table({"query": list(range(count)), "positive": [[f"p{i}", "x"] for i in range(count)],
                           "negative": pyarrow.nulls(count)})
    path = tmp_path / "pairs.parquet"
    parquet.write_table(table, path)
    status = main(text_args(tiny_bert, tmp_path / "run", "--data", str(path), "--steps", "1"))
    err = capsys.readouterr().err
    assert status == errors.USAGE  # no usable row
    last = err.strip().splitlines()[-1]
    assert "pairs.parquet" in last and "row 1: column 'query' holds int, not text" in last
