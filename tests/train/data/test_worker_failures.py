"""A data-loader worker that raises or is killed ends the run with DATA_ERROR (4) and one line naming the error
and the file, or the signal, within seconds and with no process left behind; a worker ignores a stop signal from
anyone but its main process, and dies with it."""
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from gradcache.train import errors
from gradcache.train.data.held_out import held_out_order
from gradcache.train.data.worker_failures import BATCH_WAIT_SECONDS, WorkerLoader, dead_worker
from gradcache.train.errors import DataWorkerFailed
from gradcache.train.preemption import ignore_stop_signals
from tests.train.conftest import TINY


class _Numbers(Dataset):
    """Item i is tensor i; item `bad` raises, or (kill) in a worker, the worker kills itself."""

    def __init__(self, bad: int, kill: bool = False) -> None:
        self.bad, self.kill = bad, kill

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad:
            if self.kill and get_worker_info() is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            raise KeyError(f"no number {index}")
        return torch.tensor(index)


class _Stream(IterableDataset):
    def __iter__(self):
        yield torch.tensor(0)
        if get_worker_info() is not None:
            raise OSError("the stream broke")
        yield torch.tensor(1)


class _Stuck(Dataset):
    """Item 3 never comes back in a worker: a read that never ends (a FIFO, a share that stopped answering)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 3 and get_worker_info() is not None:
            time.sleep(3600)
        return torch.tensor(index)


def _loader(dataset, workers: int) -> WorkerLoader:
    return WorkerLoader(dataset, collate_fn=torch.stack, batch_size=2, num_workers=workers,
                        worker_init_fn=ignore_stop_signals)


def test_an_error_in_a_worker_is_one_line_naming_its_type_and_message_and_the_workers_stop():
    started = time.monotonic()
    with pytest.raises(DataWorkerFailed, match=r"worker \d failed: KeyError: 'no number 5'") as raised:
        list(_loader(_Numbers(bad=5), workers=2))
    assert raised.value.exit_status == errors.DATA_ERROR == 4 and "\n" not in str(raised.value)
    assert time.monotonic() - started < 30 and not multiprocessing.active_children()


def test_an_error_in_a_streaming_worker_is_reported_the_same_way():
    with pytest.raises(DataWorkerFailed, match=r"worker \d failed: OSError: the stream broke"):
        list(WorkerLoader(_Stream(), collate_fn=lambda item: item, batch_size=None, num_workers=1,
                          worker_init_fn=ignore_stop_signals))
    assert not multiprocessing.active_children()


def test_the_batches_are_the_datasets_and_without_workers_an_error_is_raised_as_it_is():
    for workers in (0, 2):
        assert [batch.tolist() for batch in _loader(_Numbers(bad=-1), workers)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(KeyError, match="no number 5"):
        list(_loader(_Numbers(bad=5), workers=0))


@pytest.mark.slow  # a second's wait, and one more for torch to report the worker
def test_a_worker_that_sends_no_batch_within_the_wait_stops_the_run_in_one_line():
    assert _loader(_Numbers(bad=-1), workers=1).timeout == BATCH_WAIT_SECONDS
    assert _loader(_Numbers(bad=-1), workers=0).timeout == 0  # in the main process: nothing to wait for
    started = time.monotonic()
    with pytest.raises(DataWorkerFailed, match=r"no batch came from the 1 data-loader workers in 1 s") as raised:
        list(WorkerLoader(_Stuck(), collate_fn=torch.stack, batch_size=2, num_workers=1, timeout=1,
                          worker_init_fn=ignore_stop_signals))
    assert raised.value.exit_status == errors.DATA_ERROR and "\n" not in str(raised.value)
    assert time.monotonic() - started < 30 and not multiprocessing.active_children()


def test_a_killed_worker_is_one_line_naming_the_signal():
    started = time.monotonic()
    with pytest.raises(DataWorkerFailed, match=r"worker \(pid \d+\) was killed by SIGKILL"):
        list(_loader(_Numbers(bad=3, kill=True), workers=2))
    assert time.monotonic() - started < 30 and not multiprocessing.active_children()


def _exit(status: int) -> None:
    os._exit(status)


def test_a_dead_worker_is_named_by_its_signal_or_exit_status_wherever_torch_reported_it():
    """What the training loop reports when torch's SIGCHLD handler raised in the middle of a step."""
    fork = multiprocessing.get_context("fork")
    living, ended, failed = (fork.Process(target=time.sleep, args=(30,)), fork.Process(target=_exit, args=(0,)),
                             fork.Process(target=_exit, args=(3,)))
    killed = fork.Process(target=time.sleep, args=(30,))
    for process in (living, ended, failed, killed):
        process.start()
    killed.kill()
    ended.join(), failed.join(), killed.join()
    try:
        assert dead_worker([living, ended]) is None
        assert f"(pid {failed.pid}) exited with status 3" in str(dead_worker([living, ended, failed]))
        message = str(dead_worker([living, killed]))
        assert f"(pid {killed.pid}) was killed by SIGKILL" in message and "--workers" in message
    finally:
        living.kill()
        living.join()


def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _worker(ready: str) -> None:
    ignore_stop_signals(0)
    Path(ready).touch()
    time.sleep(60)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "sigwaitinfo"), reason="the sender of a signal is known on Linux only")
def test_a_worker_ignores_a_stop_signal_from_others_and_obeys_its_main_process(tmp_path):
    worker = multiprocessing.get_context("fork").Process(target=_worker, args=(str(tmp_path / "ready"),))
    worker.start()
    _wait_for_file(tmp_path / "ready")
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # a scheduler's signal: another process
    subprocess.run(["kill", "-INT", str(worker.pid)], check=True)
    worker.join(timeout=1.0)
    assert worker.is_alive()
    worker.terminate()  # what the loader and the interpreter's exit do to a worker that did not stop
    worker.join(timeout=10.0)
    assert worker.exitcode == 0


ORPHANED = """
import multiprocessing, sys, time
from pathlib import Path
from gradcache.train.preemption import ignore_stop_signals

def worker(ready):
    ignore_stop_signals(0)
    Path(ready).write_text(str(multiprocessing.current_process().pid))
    time.sleep(60)

if __name__ == "__main__":
    multiprocessing.get_context("fork").Process(target=worker, args=(sys.argv[1],), daemon=True).start()
    time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_main_process(tmp_path):
    main = subprocess.Popen([sys.executable, "-c", ORPHANED, str(tmp_path / "ready")], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        _wait_for_file(tmp_path / "ready")
        time.sleep(0.1)  # the pid is written: read it whole
        worker = int((tmp_path / "ready").read_text())
        main.kill()
        main.wait(timeout=10)
        assert _gone([worker], timeout=10), f"worker {worker} outlived its main process"
    finally:
        if main.poll() is None:
            main.kill()
        _kill_session(main.pid)


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
    return None if fields[0] == "Z" else int(fields[3])


def _in_session(session: int) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _session_of(int(entry.name)) == session]


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_session_of(pid) is not None for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_session(session: int) -> None:
    for pid in _in_session(session):
        os.kill(pid, signal.SIGKILL)


# `python -c RUN_WITH_A_BAD_WORKER FILE HOW ARGS...`: `gradcache train ARGS` whose data-loader workers, on drawing
# FILE, raise an error no decoder raises for a bad file (HOW raise) or kill themselves (HOW kill).
RUN_WITH_A_BAD_WORKER = """
import os, signal, sys
from torch.utils.data import get_worker_info
from gradcache.cli import main
from gradcache.train.data.images import lazy

bad, how, decode = sys.argv[1], sys.argv[2], lazy.decode_image

def decode_image(path, size):
    if str(path) == bad and get_worker_info() is not None:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ArithmeticError(f"the decoder's own bug on {len(str(path))} characters")
    return decode(path, size)

lazy.decode_image = decode_image
sys.exit(main(sys.argv[3:]))
"""


def _run_with_a_bad_worker(tmp_path, how: str) -> tuple[int, str, str]:
    """Run simclr with 2 workers on a folder of 40 images whose training file `bad` fails as `how` says; return
    the status, stderr and the file."""
    root = tmp_path / "data"
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for index in range(20):
            Image.new("RGB", (12, 10), (label * 120 + index * 4, 200, 30)).save(root / name / f"{index:03d}.png")
    paths = sorted(root.glob("*/*.png"))
    bad = str(paths[held_out_order(40, 8, 0, "images")[8].item()])  # a training file: every one is drawn at step 1
    argv = ["train", "simclr", *TINY["simclr"], "--data", str(root), "--test-size", "8", "--workers", "2",
            "--output-dir", str(tmp_path / "out")]
    run = subprocess.Popen([sys.executable, "-c", RUN_WITH_A_BAD_WORKER, bad, how, *argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        _, stderr = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _kill_session(run.pid)
        pytest.fail("the run did not end within 60 s")
    left = _in_session(run.pid)
    _kill_session(run.pid)
    assert not left, f"processes left behind by the run: {left}"
    return run.returncode, stderr, bad


@pytest.mark.slow
def test_a_run_whose_worker_raises_exits_4_naming_the_error_and_the_file(tmp_path):
    status, stderr, bad = _run_with_a_bad_worker(tmp_path, "raise")
    assert status == errors.DATA_ERROR, stderr
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert f"ArithmeticError: the decoder's own bug on {len(bad)} characters" in line and bad in line


@pytest.mark.slow
def test_a_run_whose_worker_is_killed_exits_4_naming_the_signal(tmp_path):
    status, stderr, _ = _run_with_a_bad_worker(tmp_path, "kill")
    assert status == errors.DATA_ERROR, stderr
    assert "Traceback" not in stderr
    assert "killed by SIGKILL" in stderr.strip().splitlines()[-1]
