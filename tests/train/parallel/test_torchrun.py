"""Two gloo ranks launched as torchrun launches them, on CPU over loopback: a worker killed mid-run under
`torchrun --max-restarts 1 ... --resume auto` is restarted with its group, which continues from the last
checkpoint and logs the losses of an uninterrupted two-rank run; a frozen rank makes the other's step fail
within --collective-timeout, with a message naming the option."""
import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradcache.cli import main
from gradcache.train import errors
from tests.multiprocess import run_on_ranks
from tests.train.conftest import TINY

# the workers are found by their environment in /proc
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")]
RUN = [*TINY["simclr"], "--steps", "12", "--checkpoint-every", "2", "--threads", "1"]


def _losses(folder: Path) -> list[tuple[str, str]]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [(row["step"], row["loss"]) for row in csv.DictReader(handle)]


def _train_on_rank(rank: int, world_size: int, folder: str) -> int:
    return main(["train", "simclr", *RUN, "--output-dir", folder])


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):  # a process that ended while we looked
            pass
    return found


def _worker(parent: int, local_rank: int, restart: int, deadline: float) -> int:
    """The pid of the torchrun worker of `local_rank` in attempt `restart`, once it runs."""
    wanted = {f"LOCAL_RANK={local_rank}".encode(), f"TORCHELASTIC_RESTART_COUNT={restart}".encode()}
    while time.monotonic() < deadline:
        for pid in _children(parent):
            try:
                if wanted <= set((Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")):
                    return pid
            except OSError:
                pass
        time.sleep(0.1)
    raise TimeoutError(f"no worker of local rank {local_rank} in attempt {restart}")


def _wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_killed_worker_is_restarted_and_the_run_logs_the_uninterrupted_losses(tmp_path):
    assert run_on_ranks(_train_on_rank, 2, str(tmp_path / "whole")) == [0, 0]
    folder = tmp_path / "elastic"
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
         "1", "--monitor-interval", "0.2", "-m", "gradcache", "train", "simclr", *RUN, "--output-dir", str(folder),
         "--resume", "auto"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    try:
        victim = _worker(torchrun.pid, 1, 0, deadline)
        _wait_for(folder / "last.pt", deadline)  # the first checkpoint: a restart has somewhere to continue from
        os.kill(victim, signal.SIGKILL)
        _worker(torchrun.pid, 1, 1, deadline)  # the group restarted: attempt 1 runs
        output, _ = torchrun.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        torchrun.kill()
    assert torchrun.returncode == 0, output
    assert _losses(folder) == _losses(tmp_path / "whole")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_frozen_rank_fails_the_step_within_the_collective_timeout(tmp_path):
    port, timeout = _free_port(), 5
    ranks = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        ranks.append(subprocess.Popen(
            [sys.executable, "-m", "gradcache", "train", "simclr", *RUN, "--steps", "400", "--output-dir",
             str(tmp_path), "--collective-timeout", str(timeout)], env=env, stderr=subprocess.PIPE, text=True))
    try:
        _wait_for(tmp_path / "last.pt", time.monotonic() + 240)
        os.kill(ranks[1].pid, signal.SIGSTOP)  # frozen: alive, its sockets open, answering nothing
        frozen = time.monotonic()
        _, err = ranks[0].communicate(timeout=timeout + 60)
        waited = time.monotonic() - frozen
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    assert ranks[0].returncode == errors.COLLECTIVE_TIMEOUT, err
    assert f"--collective-timeout {timeout} s" in err and "Traceback" not in err
    assert timeout - 1 < waited < timeout + 30  # the timeout, plus a step and the exit on a loaded machine
