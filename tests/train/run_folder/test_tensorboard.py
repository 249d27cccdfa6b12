"""`--report-to tensorboard`: RUN/tensorboard/ holds every train_log.csv column as train/<column> and every
eval_log.csv metric as eval/<metric>, at the CSV's steps, read back with TensorBoard's own EventAccumulator; a
resume and a pre-emption leave it equal to the CSV logs (bad values: test_reporters.py)."""
import csv
import os
import signal
import threading

import numpy as np
import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'gradcache[tensorboard]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.run_folder.log import TRAIN_COLUMNS, RunLog


def _csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _expected(folder) -> dict[str, list[tuple[int, np.float32]]]:
    """What TensorBoard must hold, from the CSV logs: per tag, (step, value as float32) in step order."""
    expected: dict[str, list[tuple[int, np.float32]]] = {}
    for prefix, name in (("train", "train_log.csv"), ("eval", "eval_log.csv")):
        for row in _csv(folder / name):
            for column, cell in row.items():
                if column != "step" and cell != "":
                    expected.setdefault(f"{prefix}/{column}", []).append((int(row["step"]), np.float32(cell)))
    return expected


def _scalars(folder) -> dict[str, list[tuple[int, np.float32]]]:
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    return {tag: [(event.step, np.float32(event.value)) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _open_writers() -> list[threading.Thread]:
    """The event writers' threads still running in this process (a SummaryWriter's close ends its thread)."""
    return [thread for thread in threading.enumerate() if isinstance(thread, _AsyncWriterThread) and thread.is_alive()]


def _assert_scalars_equal_the_csv_logs(folder) -> None:
    assert not _open_writers()  # the writer was closed, however the job ended
    expected, written = _expected(folder), _scalars(folder)
    assert written.keys() == expected.keys()
    for tag, points in expected.items():
        steps, values = zip(*points)
        written_steps, written_values = zip(*written[tag])
        assert written_steps == steps, tag
        np.testing.assert_array_equal(written_values, values, err_msg=tag)  # NaN equal to NaN


def test_every_train_column_and_eval_metric_at_the_csv_steps(tmp_path, tiny_args):
    folder = tmp_path / "run"
    assert main(tiny_args("simclr", folder, "--steps", "3", "--eval-every", "2", "--report-to", "tensorboard")) == 0
    _assert_scalars_equal_the_csv_logs(folder)
    tags = _scalars(folder).keys()
    assert {f"train/{column}" for column in TRAIN_COLUMNS[1:]} <= tags  # every column, each step
    metrics = [column for column in _csv(folder / "eval_log.csv")[0] if column != "step"]
    assert {f"eval/{metric}" for metric in metrics} <= tags
    assert [step for step, _ in _scalars(folder)["eval/knn_top1"]] == [0, 2, 3]  # the final too
    assert len(list((folder / "tensorboard").iterdir())) == 1  # one writer


def test_a_resume_continues_the_folder_and_drops_what_followed_its_checkpoint(tmp_path, tiny_args,
                                                                            killed_after_step):
    folder = tmp_path / "run"
    argv = tiny_args("simclr", folder, "--steps", "5", "--checkpoint-every", "2", "--report-to", "tensorboard")
    killed_after_step(3, argv)  # steps 1-3 logged, the checkpoint at step 2
    assert [step for step, _ in _scalars(folder)["train/loss"]] == [1, 2, 3]
    assert main(tiny_args("simclr", folder, "--steps", "5", "--resume", str(folder))) == 0  # --report-to kept
    assert len(list((folder / "tensorboard").iterdir())) == 2  # the same folder, a file per job
    _assert_scalars_equal_the_csv_logs(folder)
    assert [step for step, _ in _scalars(folder)["train/loss"]] == [1, 2, 3, 4, 5]  # step 3 once: the resumed one


def test_a_pre_empted_run_leaves_its_scalars_up_to_the_checkpoint(tmp_path, tiny_args, monkeypatch):
    folder = tmp_path / "run"
    original = RunLog.log_step

    def signalled_after_step_two(self, row):
        original(self, row)
        if row["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the run finishes step 3, saves it and stops

    monkeypatch.setattr(RunLog, "log_step", signalled_after_step_two)
    assert main(tiny_args("simclr", folder, "--steps", "6", "--report-to", "tensorboard")) == errors.PREEMPTED
    assert [row["step"] for row in _csv(folder / "train_log.csv")] == ["1", "2", "3"]
    _assert_scalars_equal_the_csv_logs(folder)


def test_a_new_run_in_the_folder_replaces_the_scalars_of_one_that_saved_nothing(tmp_path):
    for loss in ("2.0", "1.0"):  # a run that died before its first save, then `--resume auto` starting afresh
        with RunLog(tmp_path, report_to=["tensorboard"]) as log:
            log.log_step({"step": 1, "loss": loss})
    assert len(list((tmp_path / "tensorboard").iterdir())) == 1
    assert _scalars(tmp_path)["train/loss"] == [(1, np.float32(1.0))]


def test_ranks_other_than_zero_write_no_scalars(tmp_path):
    log = RunLog(tmp_path, enabled=False, report_to=["tensorboard"])
    log.log_step({"step": 1, "loss": "1.0"})
    log.close()
    assert not (tmp_path / "tensorboard").exists()
