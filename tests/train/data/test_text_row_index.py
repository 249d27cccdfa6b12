"""The row index of text files: the same rows in the same order as reading every row into memory, rows read on
demand (in worker processes too), many files as one set, the default h from the first rows, a saved index that a
changed file or option invalidates."""
import csv
import json
import os
import pickle
import random

import pytest

from gradcache.train.data.order import StepSampler, step_loader
from gradcache.train.data.text import usable_rows as row_rule  # where the default h is read
from gradcache.train.data.text.batches import QueryPassages
from gradcache.train.data.text.files import data_files, expand_braces
from gradcache.train.data.text.indexed_pairs import IndexedPairs
from gradcache.train.data.text.text_pairs import TextPairs, split_pairs
from gradcache.train.data.text.row_index import build_row_index, load_row_index
from gradcache.train.errors import DataError

KEYS = ("query", "positive", ("n1", "n2"))


def _rows(count, seed=0):
    """Rows with some unusable ones (empty query or positive, too few negatives) and texts that need quoting."""
    generator = random.Random(seed)
    rows = []
    for i in range(count):
        row = {"query": f"who is {i}, \"really\"?", "positive": f"number {i}\nsays hi", "n1": f"not {i}",
               "n2": f"nor {i}\t!"}
        kind = generator.random()
        if kind < 0.1:
            row["query"] = ""
        elif kind < 0.2:
            row["positive"] = " "
        elif kind < 0.3:
            row["n2"] = ""
        rows.append(row)
    return rows


def _write(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" + "\n" * (i % 7 == 0) for i, row in enumerate(rows)),
                        encoding="utf-8")
    else:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    return path


def _in_memory(rows):
    """The reference: every row in memory, filtered by the rule (h = the count most rows have)."""
    usable = [row for row in rows if row["query"].strip() and row["positive"].strip()]
    counts = [sum(1 for key in KEYS[2] if row[key].strip()) for row in usable]
    h = max(set(counts), key=lambda count: (counts.count(count), -counts.index(count)))
    kept = [row for row, count in zip(usable, counts) if count >= h]
    return TextPairs([row["query"].strip() for row in kept], [row["positive"].strip() for row in kept],
                     [[row[key].strip() for key in KEYS[2] if row[key].strip()][:h] for row in kept])


def _batches(pairs, workers=0, steps=6, batch=4):
    train = split_pairs(pairs, 5, seed=3, name="t").train
    sampler = StepSampler(len(train), batch, seed=7, start_step=0, total_steps=steps)
    return list(step_loader(QueryPassages(train), sampler, list, workers))


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv", ".csv"])
def test_the_same_rows_in_the_same_order_as_in_memory(tmp_path, suffix):
    rows = _rows(40)
    path = _write(tmp_path / f"pairs{suffix}", rows)
    with pytest.warns(UserWarning, match="skipped"):
        index = build_row_index([path], suffix, *KEYS)
    reference = _in_memory(rows)
    assert len(index) == len(reference) and len(index.skipped) == 40 - len(reference)
    assert index.skipped.count == len(index.skipped) and len(index.skipped.reasons) <= 10
    assert index.offsets.dtype.name == "int64"
    assert _batches(IndexedPairs(index)) == _batches(reference)
    assert _batches(IndexedPairs(index), workers=2) == _batches(reference)  # rows read in worker processes


def test_a_quoted_field_spanning_lines_is_one_record(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text('query,positive\n"q1","line one\nline two, still p1"\n\nq2,p2\r\n"q3 ""x""",p3\n', encoding="utf-8")
    index = build_row_index([path], ".csv")
    assert [index.row(i) for i in range(len(index))] == [("q1", "line one\nline two, still p1", []),
                                                         ("q2", "p2", []), ('q3 "x"', "p3", [])]


def test_many_files_are_one_set(tmp_path):
    rows = _rows(30)
    whole = _write(tmp_path / "whole.jsonl", rows)
    (tmp_path / "parts").mkdir()
    for part in range(3):
        _write(tmp_path / "parts" / f"part-{part:03d}.jsonl", rows[part * 10:(part + 1) * 10])
    with pytest.warns(UserWarning):
        expected = IndexedPairs(build_row_index([whole], ".jsonl", *KEYS)).materialize()
    for pattern in (tmp_path / "parts", tmp_path / "parts" / "part-*.jsonl",
                    tmp_path / "parts" / "part-{000..002}.jsonl"):
        files, text_format = data_files(pattern)
        assert [file.name for file in files] == ["part-000.jsonl", "part-001.jsonl", "part-002.jsonl"]
        with pytest.warns(UserWarning, match="part-0"):
            got = IndexedPairs(build_row_index(files, text_format, *KEYS)).materialize()
        assert (got.queries, got.positives, got.negatives) == (expected.queries, expected.positives,
                                                               expected.negatives)


def test_patterns_and_their_errors(tmp_path):
    assert expand_braces("p-{08..10}-{a,b}.tsv") == ["p-08-a.tsv", "p-08-b.tsv", "p-09-a.tsv", "p-09-b.tsv",
                                                     "p-10-a.tsv", "p-10-b.tsv"]
    assert expand_braces("{x}") == ["{x}"]
    (tmp_path / "a.jsonl").write_text('{"query": "q", "positive": "p"}\n')
    (tmp_path / "b.tsv").write_text("query\tpositive\nq\tp\n")
    with pytest.raises(DataError, match=r"mixes formats \(.jsonl, .tsv\)"):
        data_files(tmp_path)
    with pytest.raises(DataError, match="matches no file"):
        data_files(tmp_path / "*.csv")
    with pytest.raises(DataError, match=r"'.*c.jsonl' \(one of its expansions\) is not a file"):
        data_files(tmp_path / "{a,c}.jsonl")
    (tmp_path / "c[1].jsonl").write_text('{"query": "q", "positive": "p"}\n')  # a glob character in a file name
    assert data_files(tmp_path / "c[1].jsonl") == ([tmp_path / "c[1].jsonl"], ".jsonl")
    (tmp_path / "pairs.jsonl.gz").write_bytes(b"")
    with pytest.raises(DataError, match="unknown extension '.jsonl.gz'"):
        build_row_index(*data_files(tmp_path / "pairs.jsonl.gz"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holding no"):
        data_files(tmp_path / "empty")


def test_the_default_count_comes_from_the_first_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(row_rule, "FIRST_ROWS", 3)
    negatives = [1, 1, 2, 2, 2, 2, 2]  # the first three rows say h = 1; all of them would say 2
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query": f"q{i}", "positive": f"p{i}", "negs": [f"n{i}"] * count}) + "\n"
                            for i, count in enumerate(negatives)))
    index = build_row_index([path], ".jsonl", "query", "positive", ["negs"])
    assert index.negatives_per_query == 1 and len(index) == 7
    monkeypatch.setattr(row_rule, "FIRST_ROWS", 1000)
    with pytest.warns(UserWarning, match="skipped 2 of 7 rows"):
        assert build_row_index([path], ".jsonl", "query", "positive", ["negs"]).negatives_per_query == 2


def test_a_saved_index_is_reused_until_a_file_or_an_option_changes(tmp_path):
    path = _write(tmp_path / "pairs.tsv", _rows(20))
    with pytest.warns(UserWarning):
        index = build_row_index([path], ".tsv", *KEYS)
    index.save(tmp_path / "index.npz")
    loaded = load_row_index(tmp_path / "index.npz", [path], KEYS, None)
    assert loaded is not None and loaded.saved_at == tmp_path / "index.npz"
    assert [loaded.row(i) for i in range(len(loaded))] == [index.row(i) for i in range(len(index))]
    assert len(loaded.skipped) == len(index.skipped) and loaded.negatives_per_query == index.negatives_per_query
    assert pickle.loads(pickle.dumps(loaded)).row(0) == index.row(0)
    assert load_row_index(tmp_path / "index.npz", [path], KEYS, index.negatives_per_query) is not None  # resolved
    assert load_row_index(tmp_path / "index.npz", [path], KEYS, 1) is None  # another --negatives-per-query
    assert load_row_index(tmp_path / "index.npz", [path], ("query", "positive", ("n1",)), None) is None
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_row_index(tmp_path / "index.npz", [path], KEYS, None) is None  # the file changed
    (tmp_path / "broken.npz").write_bytes(b"not an index")
    assert load_row_index(tmp_path / "broken.npz", [path], KEYS, None) is None


@pytest.mark.parametrize("kind", ["parquet", "datasets"])
def test_parquet_and_a_datasets_folder_read_the_same_rows(tmp_path, kind):
    """Columnar sources, indexed by row number: the rows, order and skips of the same rows in JSONL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(40)
    rows[3]["n1"], rows[4]["n2"] = None, None  # nulls are empty
    with pytest.warns(UserWarning, match="skipped"):
        reference = IndexedPairs(build_row_index([_write(tmp_path / "pairs.jsonl", rows)], ".jsonl", *KEYS))
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        path = tmp_path / "pairs.parquet"
        pq.write_table(table, path, row_group_size=7)  # rows read across several row groups
    else:
        import datasets

        path = tmp_path / "pairs-dataset"
        datasets.Dataset(table).save_to_disk(str(path))
    files, text_format = data_files(path)
    with pytest.warns(UserWarning, match="skipped"):
        index = build_row_index(files, text_format, *KEYS)
    assert len(index.skipped) == len(reference.skipped)
    assert _batches(IndexedPairs(index)) == _batches(reference)
    assert _batches(IndexedPairs(index), workers=2) == _batches(reference)
    index.save(tmp_path / "index.npz")
    loaded = load_row_index(tmp_path / "index.npz", files, KEYS, None)
    assert loaded is not None and _batches(IndexedPairs(loaded)) == _batches(reference)
