"""`gradcache mine`: never a row's positive, the margins and the range respected (against a brute-force loop),
an output that `gradcache train text --negative-keys` reads."""
import csv
import datetime
import gzip
import json

import numpy as np
import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.commands.mine import Guards, mine_negatives
from gradcache.train.data.text.sources import read_text_pairs
from tests.train.commands.conftest import Reference, distinct_passages, pair_rows


def brute_force(queries, corpus, positives, count, margin, relative, start, end, same):
    """The negatives of each query by the module's formula, written as a plain loop."""
    result = []
    for i, query in enumerate(queries):
        scores = [float(query @ passage) for passage in corpus]
        candidates = [c for c in range(len(corpus)) if c != positives[i] and c not in same[i]]
        candidates.sort(key=lambda c: (-scores[c], c))
        window = candidates[start - 1:end]
        kept = [c for c in window if scores[c] <= scores[positives[i]] - margin
                and (relative is None or scores[c] <= scores[positives[i]] * (1 - relative))]
        result.append(kept[:count])
    return result


@pytest.mark.parametrize("margin, relative, start, end", [(0.0, None, 1, None), (0.1, None, 1, None),
                                                          (-1.0, None, 3, 9), (0.0, 0.2, 2, None),
                                                          (0.05, 0.1, 1, 5)])
def test_mine_negatives_equals_a_brute_force_loop(margin, relative, start, end):
    generator = np.random.default_rng(0)
    corpus = generator.normal(size=(30, 8))
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    positives = generator.integers(0, 30, 20)
    queries = corpus[positives] + 0.7 * generator.normal(size=(20, 8))  # near their positive, not on it
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    same = [np.array([(p + 1) % 30]) for p in positives]  # a duplicate of each positive's text
    got = mine_negatives(queries.astype(np.float32), corpus.astype(np.float32), positives, 4,
                         Guards(margin, relative, start, end), same)
    want = brute_force(queries, corpus, positives, 4, margin, relative, start, end,
                       [set(s.tolist()) for s in same])
    assert got == want
    assert any(len(row) == 4 for row in got)
    for i, row in enumerate(got):
        assert positives[i] not in row and (positives[i] + 1) % 30 not in row


@pytest.mark.parametrize("output, replace", [("mined.jsonl", False), ("mined.tsv", True)])
def test_mined_file_respects_the_margin_and_trains(tmp_path, tiny_bert, pairs_file, output, replace):
    """The mined negatives after the row's own (--negative-keys hard), de-duplicated; --replace-negatives: the
    mined alone."""
    margin = 0.02
    assert main(["mine", str(tiny_bert), "--data", str(pairs_file), "--negative-keys", "hard", "--negatives", "3",
                 "--margin", str(margin), "--output", str(tmp_path / output),
                 *(["--replace-negatives"] if replace else [])]) == 0
    keys = ["negatives"] if output.endswith(".jsonl") else ["negative_1", "negative_2", "negative_3"]
    rows = pair_rows()
    if output.endswith(".jsonl"):
        mined = [json.loads(line) for line in (tmp_path / output).read_text().splitlines()]
        negatives = [row["negatives"] for row in mined]
    else:
        with open(tmp_path / output, newline="") as handle:
            mined = list(csv.DictReader(handle, delimiter="\t"))
        negatives = [[row[key] for key in keys if row[key]] for row in mined]
    assert [row["query"] for row in mined] == [row["query"] for row in rows]
    passages = distinct_passages(rows)
    reference = Reference(tiny_bert)
    corpus = reference(passages)
    queries = reference([row["query"] for row in rows])
    want = brute_force(queries, corpus, [passages.index(row["positive"]) for row in rows], 3, margin, None, 1, None,
                       [set()] * len(rows))
    own = [[] if replace else [row["hard"]] for row in rows]
    assert negatives == [list(dict.fromkeys([*kept, *(passages[c] for c in row)])) for kept, row in zip(own, want)]
    for row, found in zip(rows, negatives):
        assert row["positive"] not in found
    unguarded = brute_force(queries, corpus, [passages.index(row["positive"]) for row in rows], 3, -np.inf, None, 1,
                            None, [set()] * len(rows))
    mined = sum(map(len, want))
    assert 0 < mined < sum(map(len, unguarded))  # the margin dropped some, not all
    pairs = read_text_pairs(tmp_path / output, negative_keys=keys, negatives_per_query=1)
    assert len(pairs) == sum(len(found) >= 1 for found in negatives)


@pytest.mark.slow  # a second or more each; the margin test keeps a row's own negatives in the quick suite
@pytest.mark.parametrize("data", ["pairs.jsonl", "pairs.csv"])
def test_a_row_s_own_negatives_are_kept_before_the_mined_ones(tmp_path, tiny_bert, data, capsys):
    """Without --negative-keys: a JSONL `negatives` list (a table's negative_1, negative_2 columns) kept first,
    then the mined ones, a text met twice kept once; no word of a run."""
    rows = pair_rows()
    positives = distinct_passages(rows, negative_key=None)
    own = [[row["hard"], positives[(i + 5) % len(positives)]] for i, row in enumerate(rows)]  # one a mined may be
    path = tmp_path / data
    if data.endswith(".jsonl"):
        path.write_text("".join(json.dumps({"query": row["query"], "positive": row["positive"], "negatives": mine})
                                + "\n" for row, mine in zip(rows, own)))
    else:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["query", "positive", "negative_1", "negative_2"])
            writer.writerows([row["query"], row["positive"], *mine] for row, mine in zip(rows, own))
    output = tmp_path / ("mined" + path.suffix)
    assert main(["mine", str(tiny_bert), "--data", str(path), "--negatives", "3", "--output", str(output)]) == 0
    assert "the run" not in capsys.readouterr().err
    if data.endswith(".jsonl"):
        negatives = [json.loads(line)["negatives"] for line in output.read_text().splitlines()]
    else:
        with open(output, newline="") as handle:
            written = list(csv.DictReader(handle))
        columns = [key for key in written[0] if key.startswith("negative_")]
        assert columns == [f"negative_{n}" for n in range(1, len(columns) + 1)]  # no input column left beside
        negatives = [[row[key] for key in columns if row[key]] for row in written]
    reference = Reference(tiny_bert)
    want = brute_force(reference([row["query"] for row in rows]), reference(positives),
                       [positives.index(row["positive"]) for row in rows], 3, 0.0, None, 1, None, [set()] * len(rows))
    expected = [list(dict.fromkeys([*mine, *(positives[c] for c in found)])) for mine, found in zip(own, want)]
    assert negatives == expected
    assert any(len(found) + 2 > len(row) for found, row in zip(want, expected))  # a duplicate was dropped


def _write_pairs(folder, records, data):
    """`records` as `data`: a .jsonl, .jsonl.gz or Parquet file, or a datasets folder (save_to_disk)."""
    path = folder / data
    lines = "".join(json.dumps(r) + "\n" for r in records)
    if data.endswith(".jsonl"):
        path.write_text(lines)
    elif data.endswith(".jsonl.gz"):
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        pyarrow = pytest.importorskip("pyarrow")
        table = pyarrow.Table.from_pylist(records)
        if data.endswith(".parquet"):
            pytest.importorskip("pyarrow.parquet").write_table(table, path)
        else:
            pytest.importorskip("datasets").Dataset(table).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("data, output", [("pairs.jsonl", "mined.jsonl"), ("pairs.jsonl", "mined.csv"),
                                          ("pairs.jsonl.gz", "mined.jsonl"), ("pairs.parquet", "mined.csv"),
                                          ("pairs-dataset", "mined.jsonl")])
def test_the_input_s_other_columns_are_kept_beside_the_mined_negatives(tmp_path, tiny_bert, data, output):
    rows = pair_rows()
    records = [{"id": f"r{i}", "query": row["query"], "positive": row["positive"], "score": i / 4,
                "tags": ["a", str(i)]} for i, row in enumerate(rows)]
    records.insert(3, {"id": "empty", "query": "", "positive": "left out"})  # unusable: not written
    path = _write_pairs(tmp_path, records, data)
    assert main(["mine", str(tiny_bert), "--data", str(path), "--negatives", "2",
                 "--output", str(tmp_path / output)]) == 0
    kept = [r for r in records if r["query"]]
    if output.endswith(".jsonl"):
        mined = [json.loads(line) for line in (tmp_path / output).read_text().splitlines()]
        assert list(mined[0]) == ["query", "positive", "id", "score", "tags", "negatives"]
        assert [(m["id"], m["score"], m["tags"]) for m in mined] == [(r["id"], r["score"], r["tags"]) for r in kept]
    else:
        with open(tmp_path / output, newline="") as handle:
            mined = list(csv.DictReader(handle))
        assert list(mined[0]) == ["query", "positive", "id", "score", "tags", "negative_1", "negative_2"]
        assert [(m["id"], m["score"], m["tags"]) for m in mined] == [
            (r["id"], json.dumps(r["score"]), json.dumps(r["tags"])) for r in kept]
    assert [m["query"] for m in mined] == [r["query"] for r in kept]


def test_a_value_json_cannot_hold_is_written_as_its_text(tmp_path, tiny_bert):
    pyarrow = pytest.importorskip("pyarrow")
    rows = pair_rows()
    when = [datetime.datetime(2026, 1, 1 + i) for i in range(len(rows))]
    table = pyarrow.Table.from_pylist([{"query": r["query"], "positive": r["positive"], "when": w, "raw": b"\x00"}
                                       for r, w in zip(rows, when)])
    pytest.importorskip("pyarrow.parquet").write_table(table, tmp_path / "pairs.parquet")
    assert main(["mine", str(tiny_bert), "--data", str(tmp_path / "pairs.parquet"), "--negatives", "1",
                 "--output", str(tmp_path / "mined.jsonl")]) == 0
    mined = [json.loads(line) for line in (tmp_path / "mined.jsonl").read_text().splitlines()]
    assert [(m["when"], m["raw"]) for m in mined] == [(str(w), str(b"\x00")) for w in when]


@pytest.mark.parametrize("case", ["corpus missing", "zero negatives", "relative margin 1", "bad range",
                                  "bad output"])
def test_bad_input_exits_2_naming_it_and_writes_nothing(capsys, tmp_path, tiny_bert, pairs_file, case):
    out = tmp_path / "out"
    out.mkdir()
    argv, named = {
        "corpus missing": (["--corpus", str(tmp_path / "nope.tsv")], "does not exist"),
        "zero negatives": (["--negatives", "0"], "--negatives must be at least 1"),
        "relative margin 1": (["--relative-margin", "1"], "--relative-margin must be in [0, 1)"),
        "bad range": (["--range", "5", "2"], "--range 5 2"),
        "bad output": (["--output", str(out / "m.txt")], "unknown extension"),
    }[case]
    defaults = [*([] if "--negatives" in argv else ["--negatives", "2"]),
                *([] if "--output" in argv else ["--output", str(out / "m.jsonl")])]
    capsys.readouterr()
    assert main(["mine", str(tiny_bert), "--data", str(pairs_file), *argv, *defaults]) == errors.USAGE
    assert named in capsys.readouterr().err
    assert list(out.iterdir()) == []
