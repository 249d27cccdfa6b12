"""`.jsonl.gz` rows streamed through the shuffle buffer: an epoch holds exactly the rows the indexed reader keeps
of the same data as plain .jsonl (less the held-out ones, the same h), in a seeded order; every row once across
2 ranks x 2 loader workers and when rows are strided over one file; a resume from a step draws the uninterrupted
batches, bad rows before it too; bad lines, a truncated file and a file that is not gzip skipped and counted;
corpus ids checked."""
import gzip
import json

import pytest
import torch

from gradcache.train.data.order import StepSampler
from gradcache.train.data.streams import Damaged, stream_loader
from gradcache.train.data.text.corpus import read_corpus
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.formats.jsonl_gz import JSONL_GZ
from gradcache.train.data.text.streamed_rows import StreamedRowBatches, load_streamed_rows, read_streamed_rows
from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.errors import DataError

KEYS = ("query", "positive", ("negatives",))


def _row(i, negatives=2):
    return {"query": f"who is {i}?", "positive": f"{i} is here", "negatives": [f"not {i}", f"nor {i}"][:negatives]}


def _lines(rows):
    """JSON lines of `rows` (a str is written as it is: a bad line), a blank line after every fifth."""
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" + "\n" * (i % 5 == 4)
                   for i, row in enumerate(rows))


def _write(path, rows, plain=False):
    """`rows` as .jsonl.gz at `path` (and as plain .jsonl beside it with `plain`)."""
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(_lines(rows))
    if plain:
        path.with_suffix("").write_text(_lines(rows), encoding="utf-8")
    return path


def _files(folder, count, per_file, first=0):
    folder.mkdir(parents=True, exist_ok=True)
    return [_write(folder / f"part-{k}.jsonl.gz", [_row(first + k * per_file + i) for i in range(per_file)])
            for k in range(count)]


def _load(files, test_size=None, seed=0, **options):
    train, held = load_streamed_rows(JSONL_GZ, files, KEYS, options.pop("negatives_per_query", None),
                                     options.pop("corpus", None), options.pop("shuffle_buffer", 5),
                                     options.pop("train_num_samples", None), test_size, seed, "test")
    return train, held


def _draw(rows, start, total, batch, rank=0, world=1, workers=1, seed=0):
    """Every batch a rank's workers make, in step order, as its loader interleaves them (in one process)."""
    batches = StreamedRowBatches(rows, StepSampler(len(rows), batch, seed, start, total, rank, world), workers, list)
    made = {}
    for worker in range(workers):
        for offset, item in enumerate(batches.worker_batches(worker)):
            made[start + worker + offset * workers] = item
    return [made[step] for step in sorted(made)]


def _queries(batches):
    return [query for examples, _, _ in batches for query, _ in examples]


def test_an_epoch_holds_the_rows_the_indexed_reader_keeps_less_the_held_out_ones(tmp_path):
    rows = [_row(i, negatives=1 if i in (5, 25) else 2) for i in range(60)]
    rows[12]["query"], rows[40]["positive"] = "", " "  # 56 usable rows, h = 2
    files = [_write(tmp_path / f"part-{k}.jsonl.gz", rows[20 * k:20 * k + 20], plain=True) for k in range(3)]
    train, held = _load(files, test_size=8, seed=3)
    index = build_row_index([file.with_suffix("") for file in files], ".jsonl", *KEYS)
    # the reference: the indexed rows file by file, in the file order seeded by --data-seed; the first 8 held out
    order = torch.randperm(3, generator=torch.Generator().manual_seed(3)).tolist()
    ordered = [index.row(i) for file in order for i in range(index.file_ends[file], index.file_ends[file + 1])]
    assert train.negatives_per_query == index.negatives_per_query == 2
    assert [held.row(i) for i in range(len(held))] == ordered[:8]
    assert len(train) == 48 and len(train.parts) == 3  # the file where the held-out rows end trains on
    epoch = _draw(train, 0, 3, batch=16)
    drawn = [(query, passages[0], passages[1:]) for examples, _, _ in epoch for query, passages in examples]
    assert sorted(drawn) == sorted(ordered[8:])
    assert _queries(_draw(train, 0, 3, batch=16)) == [row[0] for row in drawn]  # the same seed, the same order
    assert _queries(_draw(train, 0, 3, batch=16, seed=1)) != [row[0] for row in drawn]


def test_a_file_wholly_held_out_is_not_trained_on(tmp_path):
    files = _files(tmp_path, 3, 4)
    train, held = _load(files, test_size=4, seed=0)
    first = torch.randperm(3, generator=torch.Generator().manual_seed(0)).tolist()[0]
    assert [part.path for part in train.parts] == [str(file) for k, file in enumerate(files) if k != first]
    assert len(held) == 4 and len(train) == 8
    with pytest.raises(DataError, match="--test-size 12 takes every row"):
        _load(files, test_size=12)


def test_every_row_once_per_epoch_across_2_ranks_x_2_loader_workers(tmp_path):
    train, _ = _load(_files(tmp_path, 4, 12))  # 48 rows, batch 8: 6 steps per epoch, 12 rows a slot
    seen = []
    for rank in range(2):
        batches = StreamedRowBatches(train, StepSampler(48, 8, 0, 0, 6, rank, 2), 2, list)
        seen += _queries(stream_loader(batches, workers=2))
    assert sorted(seen) == sorted(_row(i)["query"] for i in range(48))


@pytest.mark.parametrize("world, workers", [(1, 2), (2, 2)])
def test_fewer_files_than_slots_stride_over_the_rows_and_cover_each_once(tmp_path, world, workers):
    train, _ = _load(_files(tmp_path, 1, 32))  # one file: every slot reads it, keeping every slots-th row
    seen = []
    for rank in range(world):
        seen += _queries(_draw(train, 0, 32 // 8, batch=8, rank=rank, world=world, workers=workers))
    assert sorted(seen) == sorted(_row(i)["query"] for i in range(32))


@pytest.mark.parametrize("count", [1, 2], ids=["striding", "dealt"])
def test_a_resume_from_a_step_draws_the_uninterrupted_batches_after_bad_rows(tmp_path, count):
    files = [_write(tmp_path / f"part-{k}.jsonl.gz", ["not json", _row(100 + k, negatives=0)]
                    + [_row(13 * k + i) for i in range(13)]) for k in range(count)]
    train, _ = _load(files)  # 13 rows a file; batch 4: crosses epochs
    whole = _draw(train, 0, 9, batch=4, workers=2)
    assert any(failed for _, _, failed in whole[:4])  # bad rows before the resumed step
    assert _draw(train, 4, 9, batch=4, workers=2) == whole[4:]


def test_bad_lines_a_truncated_file_and_a_file_that_is_not_gzip_are_skipped_and_counted_once(tmp_path):
    _write(tmp_path / "a.jsonl.gz", [_row(0), "not json", "[1, 2]", {**_row(1), "query": ""}, _row(2)])
    whole = gzip.compress(_lines([_row(3), _row(4)]).encode())
    cut = gzip.compress(_lines([_row(5)]).encode())[:6]  # a second gzip member, cut in its header
    (tmp_path / "b.jsonl.gz").write_bytes(whole + cut)
    (tmp_path / "c.jsonl.gz").write_text(_lines([_row(6)]))  # not gzip
    files, _ = data_files(tmp_path)
    units = list(JSONL_GZ.lines(str(files[1])))
    assert [unit[1] for unit in units[:-1]] == [1, 2] and isinstance(units[-1], Damaged)
    train, _ = _load(files, negatives_per_query=2)
    assert len(train) == 4
    batches = _draw(train, 0, 1, batch=4)
    failed = [name for _, _, names in batches for name in names]
    assert sorted(_queries(batches)) == sorted(_row(i)["query"] for i in range(5) if i != 1)
    assert len(failed) == 5 and sum(read for _, read, _ in batches) == 9
    for fragment in ("a.jsonl.gz line 2: not JSON", "a.jsonl.gz line 3: not a JSON object", "line 4: empty query",
                     "b.jsonl.gz (unreadable after line 2", "c.jsonl.gz (unreadable after line 0"):
        assert sum(fragment in name for name in failed) == 1, fragment


def test_eval_rows_are_read_whole_as_the_indexed_reader_reads_them(tmp_path):
    rows = [_row(i, negatives=1 + (i % 4 != 0)) for i in range(30)]
    gz = _write(tmp_path / "held.jsonl.gz", rows, plain=True)
    whole = read_streamed_rows(JSONL_GZ, [gz], KEYS, option="--eval-data")
    index = build_row_index([gz.with_suffix("")], ".jsonl", *KEYS)
    assert [whole.row(i) for i in range(len(whole))] == [index.row(i) for i in range(len(index))]
    assert whole.negatives_per_query == index.negatives_per_query and len(whole.skipped) == len(index.skipped)
    with pytest.raises(DataError, match="no column 'answer'.*--positive-key"):
        read_streamed_rows(JSONL_GZ, [gz], ("query", "answer", ()))


def test_corpus_ids_are_checked_by_the_count_or_as_rows_are_read_and_a_gzip_corpus_is_refused(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"passage {i}"}) + "\n" for i in range(10)))
    passages = read_corpus(*data_files(corpus), "corpus.jsonl")
    rows = [{"query": f"q{i}", "positive": f"d{i % 10}", "negatives": [f"d{(i + 1) % 10}"]} for i in range(12)]
    rows[9]["positive"] = "d99"
    files = [_write(tmp_path / "rows.jsonl.gz", rows)]
    with pytest.raises(DataError, match="rows.jsonl.gz line 11: passage id 'd99' is not in --corpus"):
        _load(files, corpus=passages)
    train, _ = _load(files, corpus=passages, train_num_samples=12)  # not counted: checked when read
    with pytest.raises(DataError, match="'d99'"):
        _draw(train, 0, 1, batch=12)
    zipped = _write(tmp_path / "corpus.jsonl.gz", [{"id": "d0", "text": "t"}])
    with pytest.raises(DataError, match="decompress it"):
        read_corpus(*data_files(zipped), str(zipped))
