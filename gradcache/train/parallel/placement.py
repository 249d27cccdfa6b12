"""Where a run's parameters live: replicated on every rank (one process, or DDP under torchrun) or sharded
block by block (`--fsdp`, FSDP2); a third, `--deepspeed`'s ZeRO engine, is in gradcache/train/parallel/deepspeed.py.
Everything the loop would otherwise branch on for sharding is here.

|                         | Replicated                          | Sharded (`--fsdp`)                               |
|-------------------------|-------------------------------------|--------------------------------------------------|
| process group           | torchrun's, if launched             | torchrun's, or a one-process group for the run   |
|                         | (joined and ended by the command)   |                                                  |
| encoders                | DDP-wrapped when world size > 1     | `fully_shard` per block (optimizer built after)  |
| checkpoint              | `last.pt`, written by rank 0        | `last.dcp`, every rank writes its shards         |
| who evaluates           | rank 0                              | every rank: sharded forwards are collectives     |
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gradcache import distributed
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint, run_checkpoint
from gradcache.train.config import RunConfig
from gradcache.train.errors import CollectiveFailure, UsageError
from gradcache.train import launch_environment


@contextlib.contextmanager
def launched_process_group(device: str, collective_timeout: float = 1800.0) -> Iterator[None]:
    """Under `torchrun`, the process group joined (`init_distributed_if_launched`) for the block and destroyed on
    the way out, however the block ends, but for a failed collective (CollectiveFailure): there a peer is dead or
    frozen, gloo's threads still wait on it and tearing the group down can abort the process, which the command
    then ends at once instead (gradcache.train.cli). A group that was already up (a test's, a caller's) is left up.

    Raises:
        UsageError: `collective_timeout` is not a positive, finite number of seconds.
    """
    joined = init_distributed_if_launched(device, collective_timeout)
    broken = False
    try:
        yield
    except CollectiveFailure:
        broken = True
        raise
    finally:
        if joined and not broken and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed_if_launched(device: str, collective_timeout: float = 1800.0) -> bool:
    """Under `torchrun` (WORLD_SIZE > 1 in the environment) join the process group: NCCL on CUDA (this process's
    GPU, cuda:LOCAL_RANK, made the current device first: `device_of`), else gloo; a collective that waits longer
    than `collective_timeout` seconds for a peer fails (torch.distributed.DistError) instead of hanging. Returns
    whether it joined one (the caller then ends it: `launched_process_group`).

    Raises:
        UsageError: `collective_timeout` is not a positive, finite number of seconds; torchrun's variables out of
            bounds (launch_environment.py); `device` cannot hold this rank (`check_device`: an explicit cuda:N for
            several ranks, a GPU this machine lacks).
    """
    if not 0 < collective_timeout < math.inf:
        raise UsageError(f"--collective-timeout must be a positive number of seconds, got {collective_timeout}; "
                         "e.g. --collective-timeout 1800")
    if _launched_world_size() > 1 and dist.is_available() and not dist.is_initialized():
        check_device(device, _launched_world_size(), local_rank())
        cuda = device_of(device).type == "cuda"  # NCCL's communicator takes the current GPU
        timeout = datetime.timedelta(seconds=collective_timeout)
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        # torchrun keeps its store across --max-restarts: under the same keys, a restarted group would read the
        # addresses its failed predecessor published and connect to dead ranks
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                                rank=rank, world_size=world_size, timeout=timeout)
        return True
    return False


@contextlib.contextmanager
def collective_failures(collective_timeout: float) -> Iterator[None]:
    """Turn what a failed collective raises into CollectiveFailure, in a run over more than one rank: gloo raises
    a plain RuntimeError (exactly that type: no narrower one exists) for a closed connection and for a timeout,
    the other backends and the store a torch.distributed.DistError; NCCL's watchdog aborts the process instead.
    Subclasses of RuntimeError (such as TrainingDiverged) pass through."""
    try:
        yield
    except RuntimeError as error:
        failed = type(error) is RuntimeError or isinstance(error, dist.DistError)
        if not (failed and distributed.is_distributed() and distributed.world_size() > 1):
            raise
        text = str(error).strip()
        first_line = text.splitlines()[0][:300] if text else ""
        raise CollectiveFailure(
            f"the step failed on rank {distributed.rank()} of {distributed.world_size()} ({type(error).__name__}: "
            f"{first_line}). Where another rank died or froze, a collective fails like this, at once or after "
            f"--collective-timeout {collective_timeout:g} s. Under torchrun --max-restarts N with --resume auto the "
            "group restarts from the last checkpoint; if a rank was only slow (a long evaluation or save), raise "
            "--collective-timeout") from error


def device_of(name: str) -> torch.device:
    """The device `--device name` trains on, made CUDA's current device (torch.cuda.set_device): NCCL's
    communicator, FSDP2's shards and DeepSpeed's engine are made on the current GPU, so this runs before any of
    them. `cuda` means this process's GPU: cuda:LOCAL_RANK over several ranks, the current one in one process;
    `cuda:N` means GPU N (`check_device` refuses it over several ranks: they would share it)."""
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if device.index is None:
        several = _launched_world_size() > 1 or distributed.world_size() > 1
        device = torch.device("cuda", local_rank() if several else torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device


def check_device(device: str, world_size: int, local_rank: int) -> None:
    """--device names a device that holds data and is here: cpu, cuda (cuda:N below the GPU count) or mps; over
    `world_size` > 1 ranks a GPU of this rank's own: `cuda`, which means cuda:`local_rank` (below the GPU count
    too), never an explicit cuda:N, which would put every rank of the machine on GPU N. Checked before the
    process group is joined (`init_distributed_if_launched`) and with the other options (preflight.py)."""
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise UsageError(f"--device {device}: not a device ({error}); use --device cpu, cuda or cuda:N") from error
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device {device}: a {parsed.type} device cannot train (its tensors hold no data or "
                         "this program does not run on it); use --device cpu, cuda or cuda:N")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: CUDA is not available here; use --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and world_size > 1:
        raise UsageError(f"--device {device} with {world_size} processes: every rank would train on GPU "
                         f"{parsed.index}; use --device cuda, which gives each process its own GPU (cuda:LOCAL_RANK), "
                         "and choose the GPUs with CUDA_VISIBLE_DEVICES")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s); use --device "
                         "cuda (the first, or each process's own under torchrun) or cuda:N below that count")
    if parsed.type == "cuda" and parsed.index is None and world_size > 1 and local_rank >= torch.cuda.device_count():
        raise UsageError(f"--device {device} on LOCAL_RANK {local_rank}: this machine has "
                         f"{torch.cuda.device_count()} GPU(s), so this process has none of its own; start at most "
                         f"{torch.cuda.device_count()} processes per machine (torchrun --nproc-per-node "
                         f"{torch.cuda.device_count()})")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {device}: MPS is not available here; use --device cpu")


def local_rank() -> int:
    """This process's rank on its machine, torchrun's LOCAL_RANK (0 without it; bounded: launch_environment.py)."""
    return launch_environment.local_rank()


def _launched_world_size() -> int:
    """The ranks torchrun started (WORLD_SIZE; 1 without it), known before the process group is joined (bounded,
    with RANK and LOCAL_RANK: launch_environment.py)."""
    return launch_environment.launched_world_size()


class Placement:
    """Where a run's parameters live, and what follows from it: the process group a run needs, how the
    encoders are wrapped, which ranks evaluate, how the model is gathered for evaluation, and the checkpoint
    kind. `Replicated` and `Sharded` are the two; the loop and the run know only this interface."""

    sharded: bool

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def process_group(self) -> contextlib.AbstractContextManager:
        """What the run needs around it (a one-process group for FSDP2 without torchrun)."""
        return contextlib.nullcontext()

    def place(self, encoders: nn.Module | list[nn.Module], device: torch.device) -> nn.Module | list[nn.Module]:
        """What the strategy encodes with (built before the optimizer)."""
        raise NotImplementedError

    def with_optimizer(self, encoders: nn.Module | list[nn.Module], optimizer: torch.optim.Optimizer,
                       trained: nn.Module) -> nn.Module | list[nn.Module]:
        """What the strategy encodes with once `optimizer` (over `trained`'s parameters) is built: `encoders`
        here; a DeepSpeed engine wraps one (gradcache/train/parallel/deepspeed.py)."""
        return encoders

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
        """One optimizer step on the gradients the strategy wrote, which are then cleared; one path for every
        precision: the scaler is off unless fp16. Returns False where the step found non-finite gradients that
        the caller's own check cannot see (a DeepSpeed engine's, in its partitions); True here."""
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return True

    def evaluates(self) -> bool:
        """Whether this rank runs the evaluation."""
        raise NotImplementedError

    def gathered(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """`model` whole for evaluation, as long as the block lasts."""
        return contextlib.nullcontext()

    def checkpoint(self, output_dir: str | os.PathLike) -> RunCheckpoint:
        return run_checkpoint(Path(output_dir), self.sharded)

    def load(self, saved: RunCheckpoint, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer) -> None:
        """A resume: `saved`'s tensors into `trained` and `optimizer` (see RunCheckpoint.load)."""
        saved.load(trained, optimizer)

    def whole(self, trained: nn.ModuleDict, build: Callable[[], nn.ModuleDict]) -> nn.ModuleDict | None:
        """`trained` as plain modules holding every weight, on rank 0 (None elsewhere): `trained` itself here;
        under FSDP a copy made by `build` (called on rank 0 alone). Call on every rank."""
        return trained if distributed.rank() == 0 else None


class Replicated(Placement):
    """Every rank holds the whole model; DDP averages the gradients when there is more than one."""

    sharded = False

    def place(self, encoders: nn.Module | list[nn.Module], device: torch.device) -> nn.Module | list[nn.Module]:
        """What the strategy encodes with (built before the optimizer): each distinct trained encoder wrapped
        once; a frozen one (a guide: nothing to synchronise, which DDP refuses) as it is."""
        if distributed.world_size() == 1:
            return encoders
        wrapped: dict[int, nn.Module] = {}

        def wrap(encoder: nn.Module) -> nn.Module:
            if not _trains(encoder):
                return encoder
            # gradient_as_bucket_view: the gradients live in DDP's all-reduce buckets instead of beside them, one
            # copy of the parameters' size less per rank (MiniLM: 87 MiB, about all a second rank added)
            return wrapped.setdefault(id(encoder), nn.parallel.DistributedDataParallel(
                encoder, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True))

        return wrap(encoders) if isinstance(encoders, nn.Module) else [wrap(e) for e in encoders]

    def evaluates(self) -> bool:
        return distributed.rank() == 0


class Sharded(Placement):
    """Each encoder sharded block by block with FSDP2; the optimizer must be built over the shards."""

    sharded = True

    def process_group(self) -> contextlib.AbstractContextManager:
        """Without torchrun, a one-process group (FSDP2 needs one even on one rank), ended on the way out."""
        return one_process_group(self.config.device)

    def place(self, encoders: nn.Module | list[nn.Module], device: torch.device) -> nn.Module | list[nn.Module]:
        from gradcache.train.parallel.fsdp import shard_encoder

        distinct = {id(e): e for e in ([encoders] if isinstance(encoders, nn.Module) else encoders)}
        for encoder in distinct.values():
            if _trains(encoder):  # a frozen guide stays whole on every rank
                shard_encoder(encoder, cpu_offload=self.config.cpu_offload)
        return encoders

    def evaluates(self) -> bool:
        return True

    def whole(self, trained: nn.ModuleDict, build: Callable[[], nn.ModuleDict]) -> nn.ModuleDict | None:
        """The full trained weights gathered to rank 0's CPU (a collective) and loaded into a fresh copy there; the
        frozen ones (LoRA's base) are not gathered: the copy is built with them, as the run was."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from gradcache.train.checkpoints.model_state import load_saved_state

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(trained, options=options)
        if distributed.rank() != 0:
            return None
        copy = build()
        load_saved_state(copy, state)
        return copy

    @contextlib.contextmanager
    def gathered(self, model: nn.Module) -> Iterator[None]:
        """Every FSDP unit of `model` unsharded (evaluation calls methods such as `embed`, which the forward
        hooks of the root unit do not see); a collective, so every rank enters it."""
        units = [m for m in model.modules() if callable(getattr(m, "set_requires_gradient_sync", None))]
        for unit in units:
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()


def _trains(encoder: nn.Module) -> bool:
    return any(parameter.requires_grad for parameter in encoder.parameters())


@contextlib.contextmanager
def one_process_group(device: str) -> Iterator[None]:
    """The process group a sharded placement needs: torchrun's where it made one, else a one-process group (gloo,
    and NCCL beside it on CUDA), destroyed on the way out."""
    if distributed.is_distributed():
        yield
        return
    backend = "cpu:gloo,cuda:nccl" if device_of(device).type == "cuda" else "gloo"  # NCCL on the chosen GPU
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
