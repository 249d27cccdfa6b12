"""Rows of a streamed format (formats/, `.jsonl.gz`): the files are read in order through the format's `lines`,
never by offset (a compressed file has none to seek to), each worker's through a shuffle buffer; data/streams.py
says the order (files dealt to the ranks x workers slots, or row striding when there are fewer files than slots)
and the resume.

- A unit is a non-blank line (its file, number and bytes). A worker parses the lines it keeps as they enter its
  stream and keeps the usable rows, by usable_rows.py's rule (`RowFields.unusable`: a query, a positive and at
  least h non-empty hard negatives, the first h kept). A line that is not a JSON object, or not usable, is
  skipped and counted (`skipped_rows`, and --max-bad-share as the run goes) and never buffered: a worker holds
  at most --shuffle-buffer parsed rows, and since a bad row is known as it enters the stream, a resume with the
  same --workers replays the same rows, bad ones or not. (A plain .jsonl refuses a line that is not JSON when it
  is indexed, before the run; a stream meets it mid-run.)
- A file that cannot be read to its end (truncated, corrupt, not of its format) is read up to its damage and
  counted once as a bad row, and the stream goes on with the next file: it does not stop the run.
- h by default, and the check that every key names a field: from the first FIRST_ROWS rows with a query and a
  positive, read from the head of the files in name order (`row_reader`; usable_rows.py's rule).
- Epoch length: `--train-num-samples`, or counted at start in one streamed pass over the training rows (the
  files it cannot read to their end kept in `damaged`, for a --batch-size that exceeds the count to name), which
  also checks every passage id against `--corpus` (one it lacks: DataError naming the file, line and id, before
  anything is written); with `--train-num-samples` the ids are checked as rows are read, and a missing one stops
  the run there (DataError).
- Held out (no --eval-data): the first --test-size usable rows of the files in a permutation seeded by
  --data-seed; a file wholly taken is not trained on, the file where they end trains from its next line.
- A streamed --eval-data (and `gradcache eval --data`) is read whole into memory (`read_streamed_rows`): the
  held-out set is embedded whole anyway.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradcache.train.data.bad_data import SHOWN_SKIPS, BadShare, CountedBatches, SkippedRows
from gradcache.train.data.order import StepSampler
from gradcache.train.data.streams import Damaged, StreamBatches, stream_loader
from gradcache.train.data.text.formats import StreamedFormat
from gradcache.train.data.text.formats.jsonl import json_value
from gradcache.train.data.text.usable_rows import (
    FIRST_ROWS,
    check_columns,
    check_ids,
    first_rows_negatives,
    no_usable_row,
    row_fields,
)
from gradcache.train.errors import DataError

if TYPE_CHECKING:
    from gradcache.train.data.text.corpus import PassageCorpus

Row = tuple[str, str, list[str]]  # query, positive, h hard negatives (passage ids with a corpus)


@dataclass(frozen=True)
class StreamPart:
    """A streamed file from line `first_line` on (the lines before it were held out)."""

    path: str
    first_line: int = 1

    def __str__(self) -> str:
        return self.path if self.first_line == 1 else f"{self.path} (from line {self.first_line})"


@dataclass
class RowReader:
    """What a line becomes: a usable row under `keys` (query key, positive key, negative keys) and h, or a
    `Damaged` naming the line and why; with a `corpus`, the positive and negatives are ids it must hold."""

    keys: tuple[str, str, tuple[str, ...]]
    negatives_per_query: int
    corpus: PassageCorpus | None = None

    def item(self, unit: tuple[str, int, bytes] | Damaged) -> Row | Damaged:
        """The row of `unit`.

        Raises:
            DataError: with a corpus, a passage id it lacks (a data error, not a bad row).
        """
        if isinstance(unit, Damaged):
            return unit
        path, line, raw = unit
        where = f"{Path(path).name} line {line}"
        try:
            record = json_value(raw)
        except ValueError as error:  # JSON and UTF-8 errors
            return Damaged(f"{where}: not JSON ({error})")
        if not isinstance(record, dict):
            return Damaged(f"{where}: not a JSON object")
        fields = row_fields(record, self.keys)
        if self.corpus is not None and not fields.empty:
            check_ids(self.corpus, [fields.positive, *fields.negatives], path, line)
        reason = fields.unusable(self.negatives_per_query)
        if reason is not None:
            return Damaged(f"{where}: {reason}")
        return fields.query, fields.positive, fields.negatives[:self.negatives_per_query]


def row_reader(text_format: StreamedFormat, files: Sequence[Path], keys: tuple[str, str, tuple[str, ...]],
               negatives_per_query: int | None, corpus: PassageCorpus | None = None,
               option: str = "--data") -> RowReader:
    """The reader of `files`' rows (of `text_format`): h as given, else as most of the first FIRST_ROWS rows with
    a query and a positive have it (read from the head of the files in name order).

    Raises:
        DataError: a key that names no field of those rows (naming its option).
    """
    names: set = set()
    damaged: list[str] = []

    def head() -> Iterator[dict]:  # the JSON objects of the files, in order, to the first file's damage
        for file in files:
            for unit in text_format.lines(str(file)):
                if isinstance(unit, Damaged):
                    damaged.append(unit.name)
                    break
                try:
                    record = json_value(unit[2])
                except ValueError:
                    continue
                if isinstance(record, dict):
                    names.update(record)
                    yield record

    default = first_rows_negatives(head(), keys)  # read either way: those rows' fields are what the check sees
    h = default if negatives_per_query is None else negatives_per_query
    where = f"the first {FIRST_ROWS:,} rows of {files[0]}" + (" ..." if len(files) > 1 else "")
    if not names and damaged:  # nothing read before the damage: the file itself is the fault, not its columns
        raise DataError(f"cannot read {option} {damaged[0]}; give a {text_format.name} file "
                        f"(`{text_format.decompress_command} -t FILE` checks one)")
    check_columns(names, keys, where, option)
    return RowReader(keys, h, corpus)


@dataclass
class StreamedRows:
    """Training rows streamed from files of `text_format` (data/streams.py's `StreamedFiles`); `len` is the epoch
    length in rows; `skipped` counts the bad rows met (held out, and as the run reads them); `damaged` names the
    files the count of the epoch could not read to their end (none when --train-num-samples gave it)."""

    text_format: StreamedFormat
    parts: list[StreamPart]
    num_samples: int
    shuffle_buffer: int
    reader: RowReader
    skipped: SkippedRows = field(default_factory=SkippedRows)
    damaged: list[str] = field(default_factory=list)
    items = "rows"

    def __len__(self) -> int:
        return self.num_samples

    @property
    def negatives_per_query(self) -> int:
        return self.reader.negatives_per_query

    @property
    def files(self) -> list[StreamPart]:
        return self.parts

    def units(self, part: StreamPart) -> Iterator[tuple[str, int, bytes] | Damaged]:
        return self.text_format.lines(part.path, part.first_line)

    def item(self, unit: tuple[str, int, bytes]) -> Row | Damaged:
        return self.reader.item(unit)


class RowList:
    """Rows in memory, by number, as a `RowIndex` gives them (`len`, `row(i)`, `negatives_per_query`, `skipped`):
    what `IndexedPairs` reads held-out streamed rows through."""

    def __init__(self, rows: list[Row], negatives_per_query: int, skipped: SkippedRows) -> None:
        self.rows, self.negatives_per_query, self.skipped = rows, negatives_per_query, skipped

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int) -> Row:
        return self.rows[index]


def read_streamed_rows(text_format: StreamedFormat, files: Sequence[Path], keys: tuple[str, str, tuple[str, ...]],
                       negatives_per_query: int | None = None, corpus: PassageCorpus | None = None,
                       option: str = "--data", skip_reasons: int | None = SHOWN_SKIPS) -> RowList:
    """Every usable row of the `files` of `text_format`, in memory (an --eval-data, `gradcache eval --data`); the bad
    ones skipped, counted and named in a warning.

    Raises:
        DataError: a key that names no field, an id `corpus` lacks, or no usable row.
    """
    reader = row_reader(text_format, files, keys, negatives_per_query, corpus, option)
    rows: list[Row] = []
    skipped = SkippedRows(keep=skip_reasons)
    for file in files:
        for unit in text_format.lines(str(file)):
            row = reader.item(unit)
            if isinstance(row, Damaged):
                skipped.add(row.name)
            else:
                rows.append(row)
    where = f"{option} {files[0]}" + (f" ({len(files)} files)" if len(files) > 1 else "")
    if skipped:
        warnings.warn(skipped.summary(len(rows) + len(skipped), where), stacklevel=2)
    if not rows:
        raise no_usable_row(where, reader.negatives_per_query)
    return RowList(rows, reader.negatives_per_query, skipped)


def load_streamed_rows(text_format: StreamedFormat, files: Sequence[Path], keys: tuple[str, str, tuple[str, ...]],
                       negatives_per_query: int | None, corpus: PassageCorpus | None, shuffle_buffer: int,
                       train_num_samples: int | None, test_size: int | None, data_seed: int,
                       spec: str) -> tuple[StreamedRows, RowList | None]:
    """The training rows of `files` (`--data` `spec`, of `text_format`) and, given `test_size` (None: an
    --eval-data holds out), the held-out rows; the epoch length `train_num_samples`, or counted (the module
    docstring says each rule).

    Raises:
        DataError: a key that names no field, an id `corpus` lacks, no usable training row, or a --test-size that
            takes every row.
    """
    reader = row_reader(text_format, files, keys, negatives_per_query, corpus)
    parts = [StreamPart(str(file)) for file in files]
    skipped = SkippedRows()
    held = None
    if test_size is not None:
        held, parts = _hold_out(text_format, parts, reader, test_size, data_seed, skipped, spec)
    damaged: list[str] = []
    if train_num_samples is None:
        train_num_samples = 0
        for part in parts:
            for unit in text_format.lines(part.path, part.first_line):
                if isinstance(unit, Damaged):  # the file's end: counted as a bad row as the run meets it
                    damaged.append(unit.name)
                elif not isinstance(reader.item(unit), Damaged):
                    train_num_samples += 1
        if not train_num_samples:
            raise no_usable_row(f"--data {spec} (its training rows)", reader.negatives_per_query)
    return StreamedRows(text_format, parts, train_num_samples, shuffle_buffer, reader, skipped, damaged), held


def _hold_out(text_format: StreamedFormat, parts: list[StreamPart], reader: RowReader, test_size: int, seed: int,
              skipped: SkippedRows, spec: str) -> tuple[RowList, list[StreamPart]]:
    """The first `test_size` usable rows of `parts` in a permutation seeded by `seed`, and the parts left to train
    on, in name order (a part wholly taken left out, the one where the rows end from its next line on); the bad
    rows met go to `skipped`."""
    order = torch.randperm(len(parts), generator=torch.Generator().manual_seed(seed)).tolist()
    rows: list[Row] = []
    training = dict(enumerate(parts))
    for number in order:
        units, rest = text_format.lines(parts[number].path, parts[number].first_line), None
        for unit in units:
            row = reader.item(unit)
            if isinstance(row, Damaged):
                skipped.add(row.name)
                continue
            rows.append(row)
            if len(rows) == test_size:
                if next(units, None) is not None:  # lines remain: they train
                    rest = StreamPart(parts[number].path, unit[1] + 1)
                break
        units.close()
        if rest is None:
            del training[number]
        else:
            training[number] = rest
        if len(rows) == test_size:
            break
    if len(rows) < test_size or not training:
        raise DataError(f"--test-size {test_size} takes every row of --data {spec} ({len(rows)} usable rows held out "
                        "from the head of a seeded file order); give more rows, a smaller --test-size, or --eval-data")
    return RowList(rows, reader.negatives_per_query, skipped), [training[number] for number in sorted(training)]


class StreamedRowBatches(StreamBatches):
    """The batches of `gradcache train text` from streamed rows: `tokenize` (batches.py's `TokenizeGroups`) of
    each row's query and passages, positive first (a corpus's texts for its ids)."""

    def __init__(self, data: StreamedRows, sampler: StepSampler, workers: int,
                 tokenize: Callable[[list[tuple[str, list[str]]]], list]) -> None:
        super().__init__(data, sampler.seed, sampler.batch_size, sampler.start_step, sampler.total_steps,
                         sampler.rank, sampler.world_size, workers)
        self.tokenize = tokenize

    def example(self, row: Row, epoch: int, position: int) -> tuple[str, list[str]]:
        query, positive, negatives = row
        corpus = self.data.reader.corpus
        passages = [positive, *negatives]
        return query, passages if corpus is None else [corpus.text(passage) for passage in passages]

    def collate(self, examples: list[tuple[str, list[str]]]) -> list:
        return self.tokenize(examples)


def streamed_batches(rows: StreamedRows, sampler: StepSampler, tokenize: Callable, workers: int,
                     max_bad_share: float) -> CountedBatches:
    """One batch per step of `sampler` (its seed, steps, rank and world size; not its order: the stream's), the
    bad rows read counted in `rows.skipped` and against `max_bad_share` as the run goes."""
    loader = stream_loader(StreamedRowBatches(rows, sampler, workers, tokenize), workers)
    return CountedBatches(loader, BadShare(max_bad_share, rows.skipped, items="rows", failure="could not be used"))
