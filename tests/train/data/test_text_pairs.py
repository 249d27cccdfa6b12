import json

import pytest
import torch

from gradcache.train.data.text.sources import read_text_pairs
from gradcache.train.data.text.text_pairs import TextPairs, split_pairs
from gradcache.train.errors import DataError

ROWS = [
    {"q": "who bakes bread", "p": "a baker in town", "n1": "a pilot", "n2": "a nurse"},
    {"q": "", "p": "an empty query", "n1": "x", "n2": "y"},
    {"q": "who fixes pipes", "p": "", "n1": "x", "n2": "y"},
    {"q": "who flies planes", "p": "a pilot in town", "n1": "a baker", "n2": "a tailor"},
    {"q": "who sews suits", "p": "a tailor in town", "n1": "a chef", "n2": ""},
]


def _write_table(path, separator):
    lines = [separator.join(["q", "p", "n1", "n2"])]
    lines += [separator.join(row[key] for key in ("q", "p", "n1", "n2")) for row in ROWS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name, separator", [("pairs.tsv", "\t"), ("pairs.csv", ",")])
def test_tables_keep_usable_rows_and_count_the_rest(tmp_path, name, separator):
    path = _write_table(tmp_path / name, separator)
    with pytest.warns(UserWarning, match="skipped 3 of 5 rows") as caught:
        pairs = read_text_pairs(path, "q", "p", ["n1", "n2"])
    assert "line 3: empty query" in str(caught[0].message)
    assert pairs.queries == ["who bakes bread", "who flies planes"]
    assert pairs.positives == ["a baker in town", "a pilot in town"]
    assert pairs.negatives == [["a pilot", "a nurse"], ["a baker", "a tailor"]]
    assert pairs.skipped == [f"{name} line 3: empty query", f"{name} line 4: empty positive",
                             f"{name} line 6: 1 of 2 hard negatives"]  # named as a stream names them


def test_without_negative_columns_and_with_an_explicit_count(tmp_path):
    path = _write_table(tmp_path / "pairs.tsv", "\t")
    with pytest.warns(UserWarning, match="skipped 2 of 5"):
        pairs = read_text_pairs(path, "q", "p")
    assert pairs.negatives_per_query == 0 and len(pairs) == 3
    with pytest.warns(UserWarning, match="skipped 2 of 5"):
        pairs = read_text_pairs(path, "q", "p", ["n1", "n2"], negatives_per_query=1)
    assert pairs.negatives == [["a pilot"], ["a baker"], ["a chef"]]


def test_jsonl_with_a_list_valued_negative_field(tmp_path):
    records = [{"query": "q1", "pos": "p1", "negs": ["a", "b"]},
               {"query": "q2", "pos": "p2", "negs": ["c", "d", "e"]},  # more than most rows: keeps the first two
               {"query": "q3", "pos": "p3", "negs": ["f", ""]},  # one non-empty: too few
               {"query": "q4", "pos": "p4", "negs": ["g", "h"], "other": 1},
               {"query": "q5"}]  # no positive
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="skipped 2 of 5"):
        pairs = read_text_pairs(path, "query", "pos", ["negs"])
    assert pairs.queries == ["q1", "q2", "q4"]
    assert pairs.negatives == [["a", "b"], ["c", "d"], ["g", "h"]]
    assert pairs.skipped == ["pairs.jsonl line 3: 1 of 2 hard negatives", "pairs.jsonl line 5: empty positive"]


@pytest.mark.parametrize("keys, missing, option", [
    (("query", "p", []), "query", "--query-key"),
    (("q", "positive", []), "positive", "--positive-key"),
    (("q", "p", ["n1", "negatives"]), "negatives", "--negative-keys"),
])
def test_a_missing_column_is_named(tmp_path, keys, missing, option):
    path = _write_table(tmp_path / "pairs.csv", ",")
    with pytest.raises(DataError, match=f"no column '{missing}'.*{option}"):
        read_text_pairs(path, *keys)


def test_unusable_files(tmp_path):
    with pytest.raises(DataError, match="is not a file"):
        read_text_pairs(tmp_path / "missing.tsv")
    (tmp_path / "pairs.xlsx").write_text("x")
    with pytest.raises(DataError, match="unknown extension '.xlsx'"):
        read_text_pairs(tmp_path / "pairs.xlsx")
    (tmp_path / "pairs.parquet").write_text("x")  # a format the index reads, but not a Parquet file
    with pytest.raises(DataError, match="cannot read .*pairs.parquet"):
        read_text_pairs(tmp_path / "pairs.parquet")
    (tmp_path / "bad.jsonl").write_text('{"query": "q"\n')
    with pytest.raises(DataError, match="cannot read"):
        read_text_pairs(tmp_path / "bad.jsonl")
    (tmp_path / "list.jsonl").write_text('["q", "p"]\n')
    with pytest.raises(DataError, match="line 1 is not a JSON object"):
        read_text_pairs(tmp_path / "list.jsonl")
    (tmp_path / "empty.tsv").write_text("query\tpositive\n\tp\n")
    with pytest.raises(DataError, match="has no row with a query"), pytest.warns(UserWarning):
        read_text_pairs(tmp_path / "empty.tsv")
    with pytest.raises(ValueError, match="negatives_per_query=-1"):
        read_text_pairs(tmp_path / "empty.tsv", negatives_per_query=-1)
    with pytest.raises(ValueError, match="needs negative_keys"):
        read_text_pairs(tmp_path / "empty.tsv", negatives_per_query=2)


def test_split_is_seeded_and_disjoint():
    pairs = TextPairs([f"q{i}" for i in range(20)], [f"p{i}" for i in range(20)], [[f"n{i}"] for i in range(20)])
    first, again, other = (split_pairs(pairs, 5, seed, "t") for seed in (0, 0, 1))
    assert first.test.queries == again.test.queries and first.test.queries != other.test.queries
    assert sorted(first.train.queries + first.test.queries) == sorted(pairs.queries)
    for part in (first.train, first.test):
        for query, positive, negatives in zip(part.queries, part.positives, part.negatives):
            assert positive == "p" + query[1:] and negatives == ["n" + query[1:]]
    with pytest.raises(DataError, match="--test-size"):
        split_pairs(pairs, 20, 0, "t")


def test_text_pairs_checks_its_shape():
    with pytest.raises(ValueError, match="as long"):
        TextPairs(["q"], [], [[]])
    with pytest.raises(ValueError, match="same number of hard negatives"):
        TextPairs(["q", "r"], ["p", "s"], [["n"], []])
    assert TextPairs(["q"], ["p"], [[]]).subset(torch.tensor([0])).queries == ["q"]
