"""Bad data is skipped and counted: broken table rows when the table is read, named; more than --max-bad-share
of them stops the run before it starts (exit DATA_ERROR); a training image that fails to decode when it is drawn
is replaced by the next in file order and counted in the run's skipped images."""
import csv
import json
from pathlib import Path

import pytest
from PIL import Image

from gradcache.train.cli import get_args_parser, main
from gradcache.train import errors
from gradcache.train.train_options import config_from_args, explicit_options
from gradcache.train.data.images.files import load_caption_table
from gradcache.train.data.order import epoch_order
from gradcache.train.loop import train
from gradcache.train.modes import MODES
from gradcache.train.preflight import prepare_run

BROKEN_ROWS = ['"no_caption.png"', "empty_caption.png,  ", ",a caption without an image"]


def _table(folder, good: int, broken: list[str]):
    rows = []
    for index in range(good):
        Image.new("RGB", (12, 12), (index * 6, 0, 255 - index * 6)).save(folder / f"{index}.png")
        rows.append(f"{index}.png,picture number {index}")
    (folder / "pairs.csv").write_text("filepath,title\n" + "\n".join(rows[:5] + broken + rows[5:]) + "\n")
    return folder / "pairs.csv"


def _losses(folder) -> list[str]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


def test_broken_rows_are_caught_at_load_skipped_counted_and_named(tmp_path):
    with pytest.warns(UserWarning, match=r"skipped 3 of 43 rows .*line 7: no title; line 8: empty title; line 9: "
                                         r"no filepath"):
        splits = load_caption_table(_table(tmp_path, 40, BROKEN_ROWS), 16, 8, 0)
    assert len(splits.train) + len(splits.test) == 40 and len(splits.train.skipped) == 3
    assert all(caption.strip() for caption in splits.train.captions + splits.test.captions)


def test_a_run_over_every_row_of_a_table_with_broken_rows_completes(tmp_path, tiny_args):
    table = _table(tmp_path, 40, BROKEN_ROWS)  # 3 of 43 bad: 7%
    with pytest.warns(UserWarning, match="skipped 3 of 43 rows"):  # 32 training pairs, 4 steps of 8: all drawn
        status = main(tiny_args("clip", tmp_path / "out", "--data", str(table), "--test-size", "8", "--batch-size",
                                "8", "--steps", "4", "--max-bad-share", "0.1"))
    assert status == errors.OK
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["skipped_images"] == 3


def test_more_bad_data_than_the_share_allows_exits_data_error_and_writes_nothing(tmp_path, tiny_args, capsys):
    table = _table(tmp_path, 40, BROKEN_ROWS)  # 7% > the default 5%
    with pytest.warns(UserWarning, match="skipped 3 of 43 rows"):
        status = main(tiny_args("clip", tmp_path / "out", "--data", str(table), "--test-size", "8"))
    assert status == errors.DATA_ERROR
    error = capsys.readouterr().err
    assert "3 of 43 images (7.0%)" in error and "--max-bad-share 0.05" in error and "line 7: no title" in error
    assert not (tmp_path / "out").exists()


def test_image_files_that_break_after_the_start_are_skipped_counted_and_replaced(tmp_path, tiny_args):
    """Training images are decoded when drawn: one that breaks after the start is skipped and counted as the run
    goes, and the next in file order takes its place, so every batch keeps its size."""
    options = ["--data", str(_table(tmp_path, 24, [])), "--test-size", "8", "--batch-size", "8", "--steps", "3",
               "--max-bad-share", "0.5"]
    argv = tiny_args("clip", tmp_path / "broken", *options)
    args = get_args_parser().parse_args(argv)
    config, saved, data, lock = prepare_run(config_from_args(args), explicit_options(MODES["clip"], argv))
    broken = [0, 5, 10]  # 3 of the 16 training files, none next to another: each draw of one fails once
    for index in broken:
        Path(data.train.paths[index]).write_bytes(b"garbage, not a PNG any more")
    with lock, pytest.warns(UserWarning, match="skipped images that failed to decode"):
        summary = train(config, saved, data)
    # 3 steps of 8 over 16 files: epoch 0 draws every file, step 3 the first half of epoch 1's permutation
    second_epoch = set(epoch_order(16, config.seed, 1)[:8].tolist())
    assert summary["skipped_images"] == 3 + len(second_epoch & set(broken))
    assert len(_losses(tmp_path / "broken")) == 3
