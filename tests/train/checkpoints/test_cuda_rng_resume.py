"""A resume gives each rank its own random generators back (checkpoints/atomic.py), the CUDA ones included, without
a GPU: torch.cuda's generator API (`is_available`, `device_count`, `get_rng_state_all`, `set_rng_state`,
`set_rng_state_all`) is mocked by a fake machine whose GPUs each hold one state. Two gloo ranks save one checkpoint
as a run does (rank 0 writes it) and each restores from the file; a process that sees another number of GPUs
restores the GPUs both have, by index, and says so on stderr."""
from __future__ import annotations

import contextlib
import random
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from gradcache.train.checkpoints.atomic import (
    capture_random_state,
    load_checkpoint,
    restore_random_state,
    save_checkpoint,
)
from tests.multiprocess import run_on_ranks


class FakeGpus:
    """`count` GPUs whose CUDA generators hold the states `states` (one uint8 tensor each), as torch.cuda shows
    them; setting a device the machine lacks raises IndexError, as torch's default_generators[index] does."""

    def __init__(self, states: list[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]

    def set_rng_state(self, state: torch.Tensor, device: int | str | torch.device = "cuda") -> None:
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        self.states[index] = state.clone()  # IndexError past the last GPU

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:  # torch's own loop over set_rng_state
        for index, state in enumerate(states):
            self.set_rng_state(state, index)

    @contextlib.contextmanager
    def installed(self):
        with mock.patch("torch.cuda.is_available", return_value=True), \
                mock.patch("torch.cuda.device_count", side_effect=lambda: len(self.states)), \
                mock.patch("torch.cuda.get_rng_state_all", side_effect=lambda: [s.clone() for s in self.states]), \
                mock.patch("torch.cuda.set_rng_state", side_effect=self.set_rng_state), \
                mock.patch("torch.cuda.set_rng_state_all", side_effect=self.set_rng_state_all):
            yield self


def _states(first: int, count: int) -> list[torch.Tensor]:
    return [torch.full((16,), first + index, dtype=torch.uint8) for index in range(count)]


def _a_meta(random_state: dict) -> dict:
    return {"args": {}, "model": {}, "random_state": random_state}


def _save_then_restore_on_each_rank(rank: int, world_size: int, folder: str) -> dict:
    """Each rank's generators set apart (its GPUs' states 10 * (rank + 1) + device, its CPU seed rank), saved as
    a run saves (every rank captures, rank 0 writes), scrambled, restored from the file: what each rank holds then,
    beside what it held when it saved."""
    gpus = FakeGpus(_states(10 * (rank + 1), 2))
    torch.manual_seed(rank)
    random.seed(rank)
    with gpus.installed():
        saved = {"cuda": [s.clone() for s in gpus.states], "torch": torch.get_rng_state(), "python": random.random()}
        random.seed(rank)  # the draw above advanced it
        state = capture_random_state()
        if rank == 0:
            save_checkpoint(_a_meta(state), Path(folder) / "last.pt")
        dist.barrier()
        gpus.states = _states(200, 2)
        torch.manual_seed(99)
        random.seed(99)
        restore_random_state(load_checkpoint(Path(folder) / "last.pt")["random_state"])
        return {"saved": saved, "cuda": gpus.states, "torch": torch.get_rng_state(), "python": random.random()}


def test_each_rank_resumes_its_own_generators(tmp_path):
    for rank, held in enumerate(run_on_ranks(_save_then_restore_on_each_rank, 2, str(tmp_path))):
        saved = held["saved"]
        assert all(torch.equal(a, b) for a, b in zip(held["cuda"], saved["cuda"], strict=True)), rank
        assert torch.equal(held["torch"], saved["torch"]) and held["python"] == saved["python"], rank
    assert not torch.equal(saved["cuda"][0], _states(10, 2)[0])  # the ranks' states differ: the test can tell


@pytest.mark.parametrize("saving, resuming", [(4, 2), (2, 4), (1, 8)])
def test_another_number_of_gpus_restores_by_index_and_says_so(tmp_path, capsys, saving, resuming):
    with FakeGpus(_states(1, saving)).installed():
        save_checkpoint(_a_meta(capture_random_state()), tmp_path / "last.pt")
    fresh = _states(100, resuming)
    with FakeGpus(fresh).installed() as gpus:
        restore_random_state(load_checkpoint(tmp_path / "last.pt")["random_state"])
    expected = [_states(1, saving)[i] if i < saving else fresh[i] for i in range(resuming)]  # by index, or kept
    assert all(torch.equal(a, b) for a, b in zip(gpus.states, expected, strict=True))
    message = capsys.readouterr().err
    assert f"CUDA random states of {saving} GPU(s) per process, this process sees {resuming}" in message
    assert "restored by device index" in message


def test_the_same_gpus_restore_silently(tmp_path, capsys):
    with FakeGpus(_states(1, 2)).installed():
        state = capture_random_state()
    with FakeGpus(_states(50, 2)).installed() as gpus:
        restore_random_state(state)
    assert all(torch.equal(a, b) for a, b in zip(gpus.states, _states(1, 2), strict=True))
    assert capsys.readouterr().err == ""


def test_a_rank_the_checkpoint_lacks_takes_rank_zeros_and_says_so(capsys):
    """Saved by one rank (or before each rank's were kept), resumed on two: rank 1 takes rank 0's states."""
    with FakeGpus(_states(1, 2)).installed():
        state = {**capture_random_state(), "ranks": [capture_random_state()]}
    for rank in (0, 1):
        with FakeGpus(_states(50, 2)).installed() as gpus, \
                mock.patch("gradcache.distributed.rank", return_value=rank), \
                mock.patch("gradcache.distributed.world_size", return_value=2):
            restore_random_state(state)
        assert all(torch.equal(a, b) for a, b in zip(gpus.states, _states(1, 2), strict=True)), rank
    assert capsys.readouterr().err.count("the random states of 1 ranks and the run resumes on 2") == 1


def test_a_cpu_resume_of_a_gpu_checkpoint_leaves_cuda_alone(tmp_path):
    with FakeGpus(_states(1, 2)).installed():
        state = capture_random_state()
    with mock.patch("torch.cuda.is_available", return_value=False), \
            mock.patch("torch.cuda.set_rng_state", side_effect=AssertionError("no CUDA here")):
        restore_random_state(state)  # the CPU's and Python's generators alone
