"""The text data a run or a command reads, found and read as its format says: the text mode's one door to data.

- `load_text_splits(config)`: a run's training and held-out rows. The built-in world (built_in.py), or the files
  --data names (files.py), of one format (formats/): an indexed format through a row index (row_index.py,
  indexed_pairs.py), the run folder's saved one when it indexes the same files, unchanged, under the same options
  (a resume reads no row to find its place); a streamed format through the stream (streamed_rows.py). The
  held-out rows: --test-size rows of --data, or every row of --eval-data; embedded whole, so read into memory.
  With --corpus, rows name their passages by id (corpus.py).
- `save_data_index`: RUN/data_index.npz, which a resume reads.
- `read_text_pairs`: every usable row of a file, folder or pattern, in memory (`gradcache eval`, `mine`).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gradcache.train.config import RunConfig
from gradcache.train.data.held_out import held_out_size
from gradcache.train.data.text.built_in import BUILT_IN_HARD, BUILT_IN_TEXT, generate_world
from gradcache.train.data.text.corpus import NEGATIVE_IDS_KEY, POSITIVE_ID_KEY, PassageCorpus, read_corpus
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.formats import file_suffixes, format_named
from gradcache.train.data.text.indexed_pairs import IndexedPairs
from gradcache.train.data.text.row_index import RowIndex, build_row_index, load_row_index
from gradcache.train.data.text.streamed_rows import RowList, StreamedRows, load_streamed_rows, read_streamed_rows
from gradcache.train.data.text.text_pairs import TextPairs, TextSplits, check_negative_options, split_pairs
from gradcache.train.errors import DataError, UsageError

DATA_INDEX = "data_index.npz"  # RUN/data_index.npz: the training files' row index, reused by --resume
Keys = tuple[str, str, tuple[str, ...]]


def load_text_splits(config: RunConfig) -> TextSplits:
    """The training rows of --data and the held-out rows (module docstring).

    Raises:
        UsageError: --train-num-samples for indexed rows, --corpus with built-in data, or --negatives-per-query
            without --negative-keys.
        DataError: files that cannot be found or read, a column no row has, no usable row, an id the corpus lacks.
    """
    built_in = config.data in (BUILT_IN_TEXT, BUILT_IN_HARD)
    files, format_name = ([], None) if built_in else data_files(config.data)
    text_format = None if format_name is None else format_named(format_name)
    if config.train_num_samples is not None and not getattr(text_format, "streamed", False):
        streamed = " or ".join(file_suffixes(streamed=True))
        raise UsageError(f"--train-num-samples sets the epoch length of streamed {streamed} rows; --data "
                         f"{config.data} is not {streamed} (its epoch is every training row): drop "
                         "--train-num-samples")
    if built_in:
        return _built_in_splits(config)
    corpus = None if config.corpus is None else read_corpus(*data_files(config.corpus, "--corpus"), config.corpus)
    name = f"pairs:{config.data}"
    if text_format.streamed:
        train, held = load_streamed_rows(text_format, files, row_keys(config, corpus), config.negatives_per_query,
                                         corpus, config.shuffle_buffer, config.train_num_samples,
                                         None if config.eval_data is not None
                                         else held_out_size(config.test_size, None, "rows"),
                                         config.data_seed, config.data)
        if held is None:
            held = _whole_rows(config, config.eval_data, corpus, "--eval-data")
        splits = TextSplits(train=train, test=IndexedPairs(held, corpus=corpus), name=name)
    else:
        rows = IndexedPairs(_row_index(config, files, format_name, corpus), corpus=corpus)
        if config.eval_data is None:
            splits = split_pairs(rows, config.test_size, config.data_seed, name=name)
        else:
            held_out = IndexedPairs(_whole_rows(config, config.eval_data, corpus, "--eval-data"), corpus=corpus)
            splits = TextSplits(train=rows, test=held_out, name=name)
    positions = None if corpus is None else splits.test.positive_positions()
    # the held-out rows, embedded whole
    return dataclasses.replace(splits, test=splits.test.materialize(), corpus=corpus, test_positions=positions)


def _built_in_splits(config: RunConfig) -> TextSplits:
    """The built-in world's rows: --train-size to train on, and --test-size held out or --eval-data's rows."""
    if config.corpus is not None:
        raise UsageError(f"--corpus names the passages of --data rows, but --data {config.data} is built in; "
                         "give --data a file whose rows name passages by id, or drop --corpus")
    negatives = 1 if config.negatives_per_query is None else config.negatives_per_query
    held_out = 0 if config.eval_data is not None else held_out_size(config.test_size, None, "rows")
    try:
        pairs = generate_world(config.train_size + held_out, negatives, config.data_seed,
                               hard=config.data == BUILT_IN_HARD)
    except ValueError as error:
        raise DataError(f"--train-size and --test-size: {error}") from error
    if config.eval_data is None:
        return split_pairs(pairs, held_out, config.data_seed, name=config.data)
    test = IndexedPairs(_whole_rows(config, config.eval_data, None, "--eval-data")).materialize()
    return TextSplits(train=pairs, test=test, name=config.data)


def save_data_index(train: TextPairs | IndexedPairs | StreamedRows, config: RunConfig) -> None:
    """RUN/data_index.npz: the index of indexed training rows, unless it was read from there."""
    if not isinstance(train, IndexedPairs):
        return
    path = Path(config.output_dir) / DATA_INDEX
    if train.index.saved_at != path:
        train.index.save(path)


def row_keys(config: RunConfig, corpus: PassageCorpus | None) -> Keys:
    """(query key, positive key, negative keys) of the rows: with a corpus the positive and negative fields hold
    ids, `positive_id` and `negative_ids` unless named.

    Raises:
        UsageError: --negatives-per-query without --negative-keys.
    """
    positive_key, negative_keys = config.positive_key, config.negative_keys
    if corpus is not None:
        positive_key = POSITIVE_ID_KEY if positive_key == RunConfig.positive_key else positive_key
        negative_keys = [NEGATIVE_IDS_KEY] if negative_keys is None else negative_keys
    negative_keys = tuple(negative_keys or ())
    try:
        check_negative_options(negative_keys, config.negatives_per_query)
    except ValueError as error:
        raise UsageError(str(error)) from error
    return config.query_key, positive_key, negative_keys


def _row_index(config: RunConfig, files: list[Path], format_name: str, corpus: PassageCorpus | None = None,
               option: str = "--data") -> RowIndex:
    """The row index of `files` (`option`): for --data, the run folder's saved one when it indexes the same files,
    unchanged, under the same options, else built in one streamed pass."""
    keys = row_keys(config, corpus)
    saved = None
    if config.output_dir is not None and option == "--data":
        saved = load_row_index(Path(config.output_dir) / DATA_INDEX, files, keys, config.negatives_per_query)
    if saved is not None:
        return saved
    return build_row_index(files, format_name, *keys, negatives_per_query=config.negatives_per_query, corpus=corpus,
                           option=option)


def _whole_rows(config: RunConfig, data: str, corpus: PassageCorpus | None, option: str) -> RowIndex | RowList:
    """The rows of `data` (`option`, e.g. --eval-data) to read whole: indexed, or streamed into memory."""
    files, format_name = data_files(data, option)
    text_format = format_named(format_name)
    if text_format.streamed:
        return read_streamed_rows(text_format, files, row_keys(config, corpus), config.negatives_per_query, corpus,
                                  option)
    return _row_index(config, files, format_name, corpus, option)


def read_text_pairs(path: str | os.PathLike, query_key: str = "query", positive_key: str = "positive",
                    negative_keys: list[str] | tuple[str, ...] = (),
                    negatives_per_query: int | None = None) -> TextPairs:
    """Every usable row (usable_rows.py) of a file, or a folder or pattern of files (files.py), in memory; every
    skipped row's reason is kept in `skipped`.

    Raises:
        ValueError: a bad `negatives_per_query` (check_negative_options).
        DataError: files that cannot be found or read, a column no row has, or no usable row.
    """
    check_negative_options(negative_keys, negatives_per_query)
    files, format_name = data_files(path)
    text_format = format_named(format_name)
    keys = (query_key, positive_key, tuple(negative_keys))
    if text_format.streamed:
        pairs = IndexedPairs(read_streamed_rows(text_format, files, keys, negatives_per_query,
                                                skip_reasons=None)).materialize()
    else:
        index = build_row_index(files, format_name, *keys, negatives_per_query=negatives_per_query,
                                skip_reasons=None)
        pairs = IndexedPairs(index).materialize()
        index.close()
    pairs.skipped = list(pairs.skipped)
    return pairs
