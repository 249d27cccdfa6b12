"""Run a function on several gloo ranks on CPU (loopback only) and collect what each rank returns."""
from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, folder: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def default_start_method() -> str:
    """Fork where the platform has it: the ranks inherit the imported modules instead of importing torch again
    (about 10 s a start on 2 cores); spawn elsewhere."""
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def run_on_ranks(
    fn: Callable[..., Any], world_size: int = 2, *args: Any, start_method: str | None = None
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank under a gloo process group; returns each rank's result."""
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _worker, args=(world_size, _free_port(), folder, fn, args), nprocs=world_size, join=True,
            start_method=start_method or default_start_method(),
        )
        return [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(world_size)]
