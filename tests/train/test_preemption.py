"""SIGTERM and SIGINT to a running `gradcache train` (a subprocess in a session of its own, so a signal to its
process group reaches its data workers and not pytest): the step in progress finishes, a checkpoint is
written, the exit status is PREEMPTED, and the resumed run logs exactly the losses of an uninterrupted one; a
second signal stops it at once (INTERRUPTED) with the previous checkpoint intact."""
import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.train.conftest import TINY

STEPS = 6  # more than the step a run is held at (GATED), across an epoch (4 steps of 16 of 64 images)
ARGS = [*TINY["simclr"], "--steps", str(STEPS), "--checkpoint-every", "10", "--threads", "1"]
# `python -m gradcache ARGS` whose run, once it has logged step `held_after`, waits until the file `gate` exists:
# the test signals a run that is certainly still training, however slow or fast the machine, then opens the gate.
GATED = """
import sys, time
from pathlib import Path
from gradcache.cli import main
from gradcache.train.run_folder.log import RunLog

gate_step, gate, original = int(sys.argv[1]), Path(sys.argv[2]), RunLog.log_step

def log_step(self, row):
    original(self, row)
    while row["step"] == gate_step and not gate.exists():
        time.sleep(0.01)

RunLog.log_step = log_step
sys.exit(main(sys.argv[3:]))
"""


def _gradcache(*args: str, held_after: int, gate) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", GATED, str(held_after), str(gate), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _losses(folder) -> list[str]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


def _wait_for_step(folder, step: int, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until train_log.csv holds the row of `step` (the run is then training, its handlers installed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if (folder / "train_log.csv").exists() and len(_losses(folder)) >= step:
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"no step {step} logged within {timeout} s")


def _finish(process: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    assert "Traceback" not in stderr, stderr
    return process.returncode, stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """In this process (the same code and --threads 1 give the same float sums as a subprocess's run)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    assert main(["train", "simclr", *ARGS, "--output-dir", str(folder)]) == errors.OK
    return _losses(folder)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "group", "workers"), [(signal.SIGTERM, False, "0"), (signal.SIGINT, True, "2")],
                         ids=["SIGTERM-alone", "SIGINT-to-the-group-with-2-workers"])
def test_a_signal_saves_exits_preempted_and_the_resume_logs_the_uninterrupted_losses(
        tmp_path, uninterrupted, signum, group, workers):
    folder, gate = tmp_path / "run", tmp_path / "gate"
    process = _gradcache("train", "simclr", *ARGS, "--workers", workers, "--output-dir", str(folder),
                         held_after=1, gate=gate)
    _wait_for_step(folder, 1, process)
    (os.killpg if group else os.kill)(process.pid, signum)
    gate.touch()
    status, stderr = _finish(process)

    assert status == errors.PREEMPTED, stderr
    saved = load_checkpoint(folder)
    assert 1 <= saved["step"] < STEPS and saved["step"] == len(_losses(folder))  # the step in progress, finished
    assert f"gradcache train simclr --resume {folder}" in stderr and f"step {saved['step']}" in stderr
    # resumed in this process, --threads 1 as before: the same float sums
    assert main(["train", "simclr", "--resume", str(folder), "--workers", "0", "--threads", "1", "--quiet"]) == 0
    assert _losses(folder) == uninterrupted


@pytest.mark.slow
def test_a_second_signal_stops_at_once_and_keeps_the_previous_checkpoint(tmp_path):
    folder, gate = tmp_path / "run", tmp_path / "gate"
    process = _gradcache("train", "simclr", *ARGS, "--checkpoint-every", "1", "--workers", "1", "--output-dir",
                         str(folder), held_after=2, gate=gate)
    _wait_for_step(folder, 2, process)
    os.killpg(process.pid, signal.SIGTERM)
    os.killpg(process.pid, signal.SIGINT)  # another signal number: two handler calls, not one coalesced
    gate.touch()
    status, stderr = _finish(process)

    assert status == errors.INTERRUPTED, stderr
    assert "stopped at once without saving" in stderr
    assert 1 <= load_checkpoint(folder)["step"] < STEPS  # the last complete save loads


def _signal_rank_1_during_step_2(rank: int, world_size: int, argv: list[str]) -> int:
    from gradcache.cli import main
    from gradcache.train.run import Run

    original = Run.step

    def step(self, inputs, index, stop_requested=False):
        if rank == 1 and index == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # read at the next step: rank 0 never receives it
        return original(self, inputs, index, stop_requested)

    Run.step = step
    return main(argv)


@pytest.mark.slow
def test_ranks_agree_on_the_step_a_signal_to_one_of_them_stops_at(tmp_path, tiny_args):
    from tests.multiprocess import run_on_ranks

    argv = tiny_args("simclr", tmp_path, "--steps", "6", "--threads", "1")
    # spawn, not fork: a fork after an in-process FSDP run of an earlier test cannot run autograd
    statuses = run_on_ranks(_signal_rank_1_during_step_2, 2, argv, start_method="spawn")
    assert statuses == [errors.PREEMPTED] * 2
    assert load_checkpoint(tmp_path)["step"] == 3 == len(_losses(tmp_path))


@pytest.mark.parametrize(("signum", "during"), [(signal.SIGINT, "model building"), (signal.SIGTERM, "step 0"),
                                                (signal.SIGINT, "the resume")])
def test_a_signal_before_training_starts_stops_at_once_unsaved(tmp_path, tiny_args, monkeypatch, capsys, signum,
                                                               during):
    """Ctrl-C (or SIGTERM) while the model is built, a checkpoint loaded or step 0 evaluated: nothing is trained
    or saved, the program exits INTERRUPTED at once instead of training a step and exiting PREEMPTED."""
    from gradcache.cli import main
    from gradcache.train import run as run_module
    from gradcache.train.modes import MODES
    from gradcache.train.modes.base import Mode

    folder = tmp_path / "run"
    if during == "the resume":
        assert main(tiny_args("simclr", folder)) == errors.OK
    before = load_checkpoint(folder)["step"] if during == "the resume" else None

    def signalled(original):
        def call(*args, **kwargs):
            if torch.empty(0).device.type != "meta":  # the run's own build, not preflight's shapes on the meta device
                os.kill(os.getpid(), signum)  # handled at the next bytecode, inside this call
            return original(*args, **kwargs)
        return call

    if during == "step 0":
        monkeypatch.setattr(Mode, "evaluate", signalled(Mode.evaluate))
    elif during == "model building":  # the class's method: a module's name for it may be bound elsewhere
        simclr = type(MODES["simclr"])
        monkeypatch.setattr(simclr, "build_model", signalled(simclr.build_model))
    else:
        monkeypatch.setattr(run_module.Run, "_resume", signalled(run_module.Run._resume))
    capsys.readouterr()
    argv = (["train", "simclr", "--resume", str(folder), "--steps", "4", "--quiet", "--workers", "0"]
            if during == "the resume" else tiny_args("simclr", folder))
    assert main(argv) == errors.INTERRUPTED
    stderr = capsys.readouterr().err
    assert f"{signal.Signals(signum).name} before training started" in stderr
    assert "stopped at once without saving" in stderr and "Traceback" not in stderr
    if during == "the resume":
        assert load_checkpoint(folder)["step"] == before and len(_losses(folder)) == before  # untouched
    else:
        assert not (folder / "last.pt").exists()
        assert not (folder / "train_log.csv").exists() or _losses(folder) == []
    assert signal.getsignal(signal.SIGTERM) is not None  # the handlers were put back
