"""--device on CUDA, without a GPU: the CUDA API (`torch.cuda.set_device`, `current_device`, `device_count`,
`is_available`) and the process group's constructors are mocked, and each test reads which GPU was current when a
process group or a DeepSpeed engine would have been made. The chosen GPU is the current one before any of them
(`cuda:N` in one process, cuda:LOCAL_RANK under torchrun), one-process DeepSpeed sees it as LOCAL_RANK, and a
--device that would put two ranks on one GPU, or a rank on a GPU the machine lacks, is refused (exit 2) before the
process group is joined."""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.config import RunConfig
from gradcache.train.parallel import placement
from gradcache.train.parallel.deepspeed import DeepSpeedPlacement
from gradcache.train.parallel.placement import check_device
from tests.train.conftest import TINY


class FakeCuda:
    """A machine with `count` GPUs as torch.cuda reports it; `events` records the current GPU at each call."""

    def __init__(self, count: int) -> None:
        self.count, self.current, self.events = count, 0, []

    def set_device(self, device: torch.device | int) -> None:
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else int(device)
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")  # what torch raises on a real one
        self.current = index
        self.events.append(("set_device", index))

    @contextlib.contextmanager
    def installed(self):
        with mock.patch("torch.cuda.is_available", return_value=True), \
                mock.patch("torch.cuda.device_count", return_value=self.count), \
                mock.patch("torch.cuda.set_device", side_effect=self.set_device), \
                mock.patch("torch.cuda.current_device", side_effect=lambda: self.current):
            yield self


@pytest.fixture
def one_process(monkeypatch):
    """No torchrun; what a test's code sets in the environment (DeepSpeed's LOCAL_RANK) is undone after it."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")  # recorded, so that the teardown restores the variable as it was
        monkeypatch.delenv(name)


@pytest.fixture
def torchrun(monkeypatch):
    """The environment torchrun gives rank 1 of 2 on one machine (no process group joined yet)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")


def test_an_explicit_gpu_is_made_current_in_one_process(one_process):
    with FakeCuda(2).installed() as cuda:
        device = placement.device_of("cuda:1")
    assert device == torch.device("cuda", 1) and cuda.current == 1


def test_cuda_under_torchrun_means_local_rank_before_the_group_is_joined(torchrun):
    with FakeCuda(2).installed() as cuda:
        device = placement.device_of("cuda")
    assert device == torch.device("cuda", 1) and cuda.current == 1


def test_the_one_process_group_of_a_sharded_run_is_made_on_the_chosen_gpu(one_process):
    cuda = FakeCuda(2)

    def init_process_group(backend, **kwargs):
        cuda.events.append(("init_process_group", cuda.current))

    with cuda.installed(), mock.patch.object(dist, "init_process_group", side_effect=init_process_group), \
            mock.patch.object(dist, "destroy_process_group"), mock.patch.object(dist, "HashStore"):
        with placement.one_process_group("cuda:1"):
            pass
    assert cuda.events == [("set_device", 1), ("init_process_group", 1)]


def test_torchrun_joins_nccl_on_local_rank_gpu(torchrun):
    cuda = FakeCuda(2)

    def init_process_group(backend, **kwargs):
        cuda.events.append((backend, cuda.current))

    with cuda.installed(), mock.patch.object(dist, "is_initialized", return_value=False), \
            mock.patch.object(dist, "rendezvous", return_value=iter([(dist.HashStore(), 1, 2)])), \
            mock.patch.object(dist, "init_process_group", side_effect=init_process_group):
        assert placement.init_distributed_if_launched("cuda")
    assert cuda.events[-1] == ("nccl", 1)


@pytest.mark.parametrize("device, count, named", [
    ("cuda:0", 2, "every rank would train on GPU 0"),  # two ranks, one GPU
    ("cuda:1", 2, "every rank would train on GPU 1"),
    ("cuda", 1, "LOCAL_RANK 1: this machine has 1 GPU"),  # rank 1 of 2 on a machine with one GPU
])
def test_torchrun_refuses_a_device_before_joining_the_group(torchrun, device, count, named):
    rendezvous = mock.Mock(side_effect=AssertionError("the group was joined before --device was checked"))
    with FakeCuda(count).installed() as cuda, mock.patch.object(dist, "is_initialized", return_value=False), \
            mock.patch.object(dist, "rendezvous", rendezvous):
        with pytest.raises(errors.UsageError, match=f"--device {device}.*{named}") as refused:
            placement.init_distributed_if_launched(device)
    assert refused.value.exit_status == errors.USAGE and cuda.events == [] and not rendezvous.called
    assert "--device cuda" in str(refused.value)  # the fix


def test_the_program_exits_2_naming_the_device(torchrun, tmp_path, capsys):
    argv = ["train", "simclr", *TINY["simclr"], "--output-dir", str(tmp_path / "run"), "--device", "cuda:0"]
    with FakeCuda(2).installed(), mock.patch.object(dist, "rendezvous", side_effect=AssertionError("joined")):
        assert main(argv) == errors.USAGE
    assert "--device cuda:0 with 2 processes" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("device, world_size, local_rank, fits", [
    ("cuda:1", 1, 0, True), ("cuda", 2, 1, True), ("cuda", 1, 0, True),
    ("cuda:2", 1, 0, False), ("cuda:0", 2, 0, False), ("cuda", 3, 2, False),
])
def test_check_device_against_brute_force_rule(device, world_size, local_rank, fits):
    """The rule written out: each rank gets a GPU of its own that this machine has."""
    with FakeCuda(2).installed():
        index = torch.device(device).index
        own = (local_rank if world_size > 1 else 0) if index is None else index
        assert fits == (own < 2 and (index is None or world_size == 1))
        with contextlib.nullcontext() if fits else pytest.raises(errors.UsageError, match=f"--device {device}"):
            check_device(device, world_size, local_rank)


def test_one_process_deepspeed_sees_the_chosen_gpu_as_local_rank(one_process):
    cuda, seen = FakeCuda(2), []

    @contextlib.contextmanager
    def group(device):
        seen.append((placement.local_rank(), cuda.current))
        yield

    with cuda.installed(), mock.patch("gradcache.train.parallel.deepspeed.one_process_group", group):
        with DeepSpeedPlacement(RunConfig(mode="text", device="cuda:1")).process_group():
            pass
    assert seen == [(1, 1)]
