"""Two gloo processes on CPU train the same model as one process on the whole global batch."""
from pathlib import Path

import torch

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.multiprocess import run_on_ranks

# The ranks' one thread: resizing the OpenMP pool in a process forked after the parent used it can hang.
ONE_THREAD = ["--threads", "1"]


def _train_on_rank(rank: int, world_size: int, argv: list[str]) -> tuple[int, int]:
    status = main(argv)  # the program trains over the process group run_on_ranks started, and leaves it up
    return status, torch.distributed.get_world_size()


def test_two_processes_match_one_process(tmp_path: Path, tiny_args):
    args = ["--strategy", "gradcache", "--steps", "2", "--norm", "group"]  # BatchNorm buffers are per rank
    assert run_on_ranks(_train_on_rank, 2, tiny_args("simclr", tmp_path / "two", *args, *ONE_THREAD)) == [(0, 2)] * 2
    assert main(tiny_args("simclr", tmp_path / "one", *args)) == 0
    two, one = (load_checkpoint(tmp_path / d) for d in ("two", "one"))
    assert two["step"] == one["step"] == 2
    for name in one["model"]:
        torch.testing.assert_close(two["model"][name], one["model"][name], rtol=1e-4, atol=1e-5, msg=name)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
