"""The rows a `gradcache train vlm` run reads: the one door (`load_vision_language_splits`).

- --data shapes (built_in.py): the clip mode's shapes and captions, --train-size rows to train, the held-out rows
  from an independent stream.
- Otherwise the files --data names, read into memory (read_rows.py), in any text format.
- Held out: every row of --eval-data (same formats), or `held_out_size(--test-size, rows)` rows of --data chosen
  by a permutation seeded by --data-seed (data/held_out.py, the text mode's rule for small files), none of which
  trains. The held-out rows are opened once now: one whose images cannot be used is left out and counted (it
  would stop every evaluation), as the image modes leave out a held-out image that does not decode.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from gradcache.train.config import RunConfig
from gradcache.train.data.held_out import held_out_order, held_out_size
from gradcache.train.data.images.row_images import BadRowImage
from gradcache.train.data.text.files import data_files
from gradcache.train.data.vision_language.built_in import BUILT_IN_VLM, built_in_held_out, built_in_train
from gradcache.train.data.vision_language.opened_input import opened_row
from gradcache.train.data.vision_language.read_rows import read_rows
from gradcache.train.data.vision_language.rows import TrainingRows, VisionLanguageRow, VisionLanguageSplits
from gradcache.train.errors import DataError, UsageError


def load_vision_language_splits(config: RunConfig) -> VisionLanguageSplits:
    """The training and held-out rows of `config` (module docstring).

    Raises:
        UsageError: --train-num-samples (the rows are read whole: an epoch is every training row), or
            --negatives-per-query above 0 with no negatives' keys.
        DataError: files that cannot be found or read, a key given that names no field, no usable row, a
            held-out split that leaves no row to train, or no held-out row whose images open.
    """
    if config.train_num_samples is not None:
        raise UsageError(f"--train-num-samples sets the epoch of streamed data; gradcache train vlm reads --data "
                         f"{config.data} whole (an epoch is every training row): drop --train-num-samples")
    if config.data == BUILT_IN_VLM:
        train = built_in_train(config)
        root = None if config.eval_data is None else image_root(config, config.eval_data, "--eval-data")
        test = (built_in_held_out(held_out_size(config.test_size, None, "rows"), config.data_seed)
                if config.eval_data is None else read_rows(config, config.eval_data, "--eval-data", root).rows)
        return VisionLanguageSplits(train, _opening(test, root, train), BUILT_IN_VLM, root, 0)
    root = image_root(config, config.data, "--data")
    rows = read_rows(config, config.data, "--data", root)
    if config.eval_data is None:
        test_size = held_out_size(config.test_size, len(rows.rows), "rows")
        try:
            order = held_out_order(len(rows.rows), test_size, config.data_seed, "rows").tolist()
        except ValueError as error:
            raise DataError(f"--data {config.data}: {error}") from error
        train = TrainingRows([rows.rows[index] for index in order[test_size:]], rows.skipped)
        test = [rows.rows[index] for index in order[:test_size]]
    else:
        train = TrainingRows(rows.rows, rows.skipped)
        test = read_rows(config, config.eval_data, "--eval-data", root).rows
    return VisionLanguageSplits(train, _opening(test, root, train), f"rows:{config.data}", root,
                                rows.negatives_per_query)


def image_root(config: RunConfig, data: str, option: str) -> Path:
    """Where relative image paths resolve: --image-root, else the folder of the first file `data` names."""
    if config.image_root is not None:
        return Path(config.image_root).resolve()
    files, _ = data_files(data, option)
    return files[0].parent.resolve()


def _opening(rows: list[VisionLanguageRow], root: Path | None, train: TrainingRows) -> list[VisionLanguageRow]:
    """The held-out `rows` whose images open; the others left out, counted in `train.skipped` and named in a
    warning.

    Raises:
        DataError: none opens.
    """
    kept, failed = [], []
    for row in rows:
        try:
            opened_row(row, root)
        except BadRowImage as error:
            failed.append(f"{row.where} ({error})")
        else:
            kept.append(row)
    if failed:
        shown = "; ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")
        warnings.warn(f"left out {len(failed)} of {len(rows)} held-out rows whose images could not be used: {shown}",
                      stacklevel=3)
        train.skipped.extend(failed)
    if not kept:
        raise DataError(f"none of the {len(rows)} held-out rows' images can be used (first: {failed[0]}); check the "
                        "images and --image-root")
    return kept
