"""The process group of a command launched by torchrun: joined by the command and destroyed when it ends, by
any exit but a failed collective; and a rank that dies while the group checks the run (before training) fails
the others' broadcast with COLLECTIVE_TIMEOUT and its message, not a traceback. Two gloo ranks forked with
torchrun's environment, on CPU over loopback."""
import json
import multiprocessing
import os
import socket
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from gradcache.cli import main
from gradcache.train import errors, preflight
from tests.train.conftest import TINY

RUN = ["train", "simclr", *TINY["simclr"], "--steps", "1", "--threads", "1", "--collective-timeout", "60"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank(rank: int, port: int, folder: str, argv: list[str], rank_zero_dies: bool) -> None:
    """One worker as torchrun starts it: the environment names the group, `main` joins it."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    sys.stderr = open(Path(folder) / f"rank{rank}.err", "w", buffering=1)  # noqa: SIM115 (closed by the exit)
    if rank_zero_dies and rank == 0:  # dies while it holds the folder, before it tells the other rank
        preflight.remove_stale_temporaries = lambda folder: os._exit(1)
    status = main(argv)
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps([status, dist.is_initialized()]))


def _launch(tmp_path: Path, argv: list[str], rank_zero_dies: bool = False) -> list[tuple[int, list | None, str]]:
    """Each rank's exit code, what it recorded after `main` returned (None if it never did) and its stderr."""
    # forked from a fork server that imported this module once (fast to start), not from pytest: a fork of a
    # process that has run FSDP with CPU offload (tests/train/parallel/test_cli_fsdp.py) hangs in the ranks
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    port = _free_port()
    ranks = [context.Process(target=_rank, args=(r, port, str(tmp_path), argv, rank_zero_dies)) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(180)
        if process.is_alive():
            process.kill()
    results = []
    for rank, process in enumerate(ranks):
        recorded = tmp_path / f"rank{rank}.json"
        results.append((process.exitcode, json.loads(recorded.read_text()) if recorded.exists() else None,
                        (tmp_path / f"rank{rank}.err").read_text()))
    return results


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(),
                                 reason="forks the ranks from a fork server")]


def test_a_run_ends_the_group_it_joined(tmp_path):
    results = _launch(tmp_path, [*RUN, "--output-dir", str(tmp_path / "run")])
    assert [(code, recorded) for code, recorded, _ in results] == [(0, [0, False])] * 2, results
    assert (tmp_path / "run" / "last.pt").exists()


def test_a_refused_run_ends_the_group_too(tmp_path):
    results = _launch(tmp_path, [*RUN, "--batch-size", "15", "--output-dir", str(tmp_path / "run")])
    assert [(code, recorded) for code, recorded, _ in results] == [(0, [errors.USAGE, False])] * 2, results
    assert all("not divisible by the 2 processes" in err for _, _, err in results)


def test_a_rank_dying_in_the_checks_fails_the_others_with_collective_timeout(tmp_path):
    (rank_zero, _, _), (code, recorded, err) = _launch(tmp_path, [*RUN, "--output-dir", str(tmp_path / "run")],
                                                       rank_zero_dies=True)
    assert rank_zero == 1
    assert (code, recorded) == (errors.COLLECTIVE_TIMEOUT, None), err  # main ends the process at once
    assert "the step failed on rank 1 of 2" in err and "--collective-timeout" in err and "Traceback" not in err
