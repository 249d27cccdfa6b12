"""Large .jsonl files indexed in byte ranges in forked processes: exactly the serial pass's index (offsets, file
ends, h, skips and their reasons, rows read, warning), the same first error, ranges cut only after newlines."""
import json
import os
import random
import signal
import warnings

import numpy as np
import pytest

from gradcache.train.data.text import parallel_index, row_index
from gradcache.train.data.text import usable_rows as row_rule  # where the default h is read
from gradcache.train.data.text.corpus import read_corpus
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.parallel_index import (
    LineRange,
    byte_ranges,
    count_newlines,
    in_processes,
    parallel_processes,
)
from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.data.bad_data import SHOWN_SKIPS
from gradcache.train.errors import DataError

KEYS = ("query", "positive", ("negs", "extra"))


def _rows(count, seed=0):
    """Rows with a list-valued negatives field of varying length (the head has fewer negatives than the rest,
    so h from the first rows differs from h over all of them), unusable rows and lines of very different
    lengths."""
    generator = random.Random(seed)
    rows = []
    for i in range(count):
        negatives = [f"n{i}.{j}" for j in range(1 if i < 15 else generator.choice([2, 2, 3]))]
        if generator.random() < 0.2:
            negatives[0] = " "  # an empty negative is not counted
        row = {"query": f"q{i} " + "x" * generator.choice([0, 5, 300, 4000]), "positive": f"p{i}",
               "negs": negatives, "extra": generator.choice(["", f"e{i}"])}
        kind = generator.random()
        if kind < 0.08:
            row["query"] = ""
        elif kind < 0.16:
            row["positive"] = " "
        rows.append(row)
    return rows


def _lines(rows):
    """The lines of `rows` as JSONL, with blank lines among them."""
    return [line for i, row in enumerate(rows) for line in [json.dumps(row)] + [""] * (i % 9 == 0)]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _line_at(lines, share):
    """The index of the first non-blank line that starts past `share` of the file's bytes."""
    starts = np.cumsum([0] + [len(line.encode()) + 1 for line in lines])
    return next(i for i, line in enumerate(lines) if line and starts[i] > share * starts[-1])


def _parallel(monkeypatch, processes):
    """Every .jsonl set takes the parallel path in `processes` processes; returns the list of its calls."""
    calls = []
    original = row_index.map_line_ranges

    def spy(task, files, count):
        calls.append(count)
        return original(task, files, count)

    monkeypatch.setattr(parallel_index, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel_index, "usable_cores", lambda: processes)
    monkeypatch.setattr(row_index, "map_line_ranges", spy)
    return calls


def _build(*args, **kwargs):
    """(the index, its warnings' messages) or, for a DataError, (None, its message)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            index = build_row_index(*args, **kwargs)
        except DataError as error:
            return None, str(error)
    return index, [str(warning.message) for warning in caught]


def _serial_and_parallel(monkeypatch, processes, *args, **kwargs):
    """`_build` serially, then in `processes` processes (checked to take the parallel path)."""
    serial = _build(*args, **kwargs)
    with monkeypatch.context() as patch:
        calls = _parallel(patch, processes)
        parallel = _build(*args, **kwargs)
    assert calls == [processes]
    return serial, parallel


def _assert_same(serial, parallel):
    (first, first_warnings), (second, second_warnings) = serial, parallel
    assert second.offsets.dtype == np.int64 and np.array_equal(first.offsets, second.offsets)
    assert np.array_equal(first.file_ends, second.file_ends) and second.file_ends.dtype == np.int64
    assert (first.negatives_per_query, first.rows_read, first.headers) == (second.negatives_per_query,
                                                                           second.rows_read, second.headers)
    assert (first.skipped.count, first.skipped.reasons) == (second.skipped.count, second.skipped.reasons)
    assert first_warnings == second_warnings
    assert [first.row(i) for i in range(len(first))] == [second.row(i) for i in range(len(second))]


# each pair of (processes, h given or not, files) once: 6 cases, not the 12 of the grid
@pytest.mark.parametrize(("processes", "negatives_per_query", "sizes"), [
    (2, None, (120,)), (2, 1, (70, 5, 0, 45)), *[pytest.param(*case, marks=pytest.mark.slow) for case in [
        (3, 1, (120,)), (3, None, (70, 5, 0, 45)), (5, None, (120,)), (5, 1, (70, 5, 0, 45))]]])
# one file; several, one of them small, one empty; more processes than 2 in the slow run
def test_the_parallel_index_is_the_serial_index(tmp_path, monkeypatch, processes, negatives_per_query, sizes):
    monkeypatch.setattr(row_rule, "FIRST_ROWS", 20)  # h from the head, which has fewer negatives
    rows = _rows(sum(sizes))
    files, start = [], 0
    for number, size in enumerate(sizes):
        files.append(_write(tmp_path / f"part-{number}.jsonl", _lines(rows[start:start + size])))
        start += size
    for skip_reasons in (SHOWN_SKIPS, None):
        serial, parallel = _serial_and_parallel(monkeypatch, processes, files, ".jsonl", *KEYS,
                                                negatives_per_query=negatives_per_query, skip_reasons=skip_reasons)
        _assert_same(serial, parallel)
    index = serial[0]
    assert index.skipped.count > SHOWN_SKIPS and len(index.skipped.reasons) == index.skipped.count
    if negatives_per_query is None:
        assert index.negatives_per_query == 1  # the head's count, where most rows have 2 or more


def test_a_corpus_is_inherited_by_the_workers(tmp_path, monkeypatch):
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps({"id": f"d{i}", "text": f"passage {i}"}) + "\n" for i in range(50)))
    corpus = read_corpus(*data_files(corpus_file, "--corpus"), "corpus.jsonl")
    rows = [{"query": f"q{i}" + "y" * (i % 7) * 50, "positive_id": f"d{i % 50}",
             "negative_ids": [f"d{(i + 1) % 50}", f"d{(i + 2) % 50}"][:1 + i % 3 // 2]} for i in range(200)]
    path = _write(tmp_path / "pairs.jsonl", _lines(rows))
    _assert_same(*_serial_and_parallel(monkeypatch, 4, [path], ".jsonl", "query", "positive_id", ("negative_ids",),
                                       corpus=corpus))


@pytest.mark.slow
def test_the_first_bad_line_in_file_order_raises_the_serial_error(tmp_path, monkeypatch):
    lines = _lines(_rows(300))
    second, third = _line_at(lines, 0.4), _line_at(lines, 0.8)  # in the second and the third of 3 ranges
    path = tmp_path / "pairs.jsonl"
    for first_bad, later_bad in [('{"query": "q", "positive": ', "[1, 2]"), ("[1, 2]", '{"query": "q"')]:
        bad = lines.copy()
        bad[second], bad[third] = first_bad, later_bad
        serial, parallel = _serial_and_parallel(monkeypatch, 3, [_write(path, bad)], ".jsonl", *KEYS)
        assert serial[0] is None and parallel == serial and f"{path} line {second + 1}" in serial[1]
    ranges = byte_ranges([path], 3)
    start = sum(len(line.encode()) + 1 for line in lines[:second])
    assert len(ranges) == 3 and ranges[1].start < start < ranges[1].end
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text(json.dumps({"id": "d0", "text": "t"}) + "\n")
    corpus = read_corpus(*data_files(corpus_file, "--corpus"), "corpus.jsonl")
    ids = [json.dumps({"query": "q", "positive_id": "d9" if i == second else "d0"}) if line else ""
           for i, line in enumerate(lines)]  # an id the corpus lacks, in the second range
    serial, parallel = _serial_and_parallel(monkeypatch, 3, [_write(path, ids)], ".jsonl", "query", "positive_id",
                                            corpus=corpus)
    assert serial[0] is None and parallel == serial and f"line {second + 1}: passage id 'd9'" in serial[1]


def test_ranges_cut_only_after_newlines(tmp_path):
    generator = random.Random(5)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"".join(b"x" * generator.choice([0, 1, 10, 3000, 20000]) + b"\n" for _ in range(200))
                    + b"no newline at the end")
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"a\nb\n")
    files = [big, small]
    for parts in range(1, 10):
        ranges = byte_ranges(files, parts)
        assert len(ranges) <= parts + len(files)
        for number, file in enumerate(files):
            data = file.read_bytes()
            mine = [piece for piece in ranges if piece.file_number == number]
            assert mine[0].start == 0 and mine[-1].end == len(data) and all(piece.path == str(file) for piece in mine)
            assert all(before.end == after.start for before, after in zip(mine, mine[1:]))  # contiguous, in order
            assert all(data[piece.start - 1:piece.start] == b"\n" for piece in mine[1:])  # just after a newline
            assert sum(count_newlines(piece) for piece in mine) == data.count(b"\n")
        assert [piece.file_number for piece in ranges if piece.file_number == 1] == [1]  # a small file whole


def test_when_the_parallel_path_is_taken(tmp_path, monkeypatch):
    path = _write(tmp_path / "pairs.jsonl", _lines(_rows(30)))
    assert parallel_processes([path]) == 1  # small: the serial pass
    monkeypatch.setattr(parallel_index, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel_index, "usable_cores", lambda: 64)
    assert parallel_processes([path]) == parallel_index.MAX_PROCESSES
    monkeypatch.setattr(parallel_index, "usable_cores", lambda: 1)
    assert parallel_processes([path]) == 1
    calls = _parallel(monkeypatch, 4)
    table = tmp_path / "pairs.tsv"
    table.write_text("query\tpositive\nq\tp\n")
    build_row_index([table], ".tsv")  # a table's record may span lines: never cut
    kept = []
    build_row_index([path], ".jsonl", *KEYS, on_kept=kept.append, warn=False)  # wants the records here, in order
    assert calls == [] and len(kept) > 0


def test_the_ranks_of_a_node_share_its_cores(monkeypatch):
    """Under torchrun each rank indexes the same files at once: LOCAL_WORLD_SIZE ranks divide the cores."""
    monkeypatch.setattr(parallel_index.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert parallel_index.usable_cores() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert parallel_index.usable_cores() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert parallel_index.usable_cores() == 1


def _kill_the_second(line_range):
    if line_range.file_number == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return line_range.file_number


def test_a_worker_killed_without_its_results_is_a_memory_error_not_a_wait_forever():
    ranges = [LineRange(number, f"f{number}", 0, 10) for number in range(3)]
    with pytest.raises(MemoryError, match="died .*killed by a signal"):
        in_processes(_kill_the_second, ranges, 3)
    assert in_processes(lambda line_range: line_range.file_number, ranges[:1] + ranges[2:], 3) == [0, 2]


def test_many_ranges_run_in_at_most_p_processes_in_order(monkeypatch):
    ranges = [LineRange(number, f"f{number}", 0, 10 + number) for number in range(11)]
    started = []
    original = parallel_index.multiprocessing.get_context

    def counted(method):
        context = original(method)
        process = context.Process

        class Counted(process):
            def start(self):
                started.append(self)
                super().start()

        monkeypatch.setattr(context, "Process", Counted)
        return context

    monkeypatch.setattr(parallel_index.multiprocessing, "get_context", counted)
    assert in_processes(lambda line_range: line_range.file_number, ranges, 3) == list(range(11))
    assert len(started) == 3
