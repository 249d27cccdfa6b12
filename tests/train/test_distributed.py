"""Two gloo processes on CPU train the same model as one process on the whole global batch."""
import os
import socket

import torch
import torch.multiprocessing as mp

from gradcache.cli import main
from gradcache.train.checkpoint import load_checkpoint


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world_size, port, argv):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    status = main(argv)
    torch.distributed.destroy_process_group()
    if status != 0:
        raise SystemExit(status)


def test_two_processes_match_one_process(tmp_path, tiny_args):
    args = ["--strategy", "gradcache", "--steps", "2", "--norm", "group"]  # BatchNorm buffers are per rank
    mp.spawn(_rank, args=(2, _free_port(), tiny_args("simclr", tmp_path / "two", *args)), nprocs=2)
    assert main(tiny_args("simclr", tmp_path / "one", *args)) == 0
    two, one = (load_checkpoint(tmp_path / d) for d in ("two", "one"))
    assert two["step"] == one["step"] == 2
    for name in one["model"]:
        torch.testing.assert_close(two["model"][name], one["model"][name], rtol=1e-4, atol=1e-5, msg=name)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
