"""Sharding what does not fit, for `torchrun` runs: FSDP2 block by block, CPU offload, sharded checkpoints that
resume on any number of ranks, and an 8-bit AdamW from bitsandbytes.

Memory per rank for P parameters in float32 with AdamW (4 bytes each for parameter, gradient and two moments):
DDP holds 16 P; FSDP holds 16 P / world_size plus the gathered parameters of one block at a time (of every
block while a chunk's forward runs with `reshard_after_forward=False`); CPU offload moves the sharded
parameters, gradients and optimizer state to CPU memory; 8-bit AdamW stores the two moments in 2 P bytes
instead of 8 P.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from gradcache import distributed
from gradcache.train.checkpoint import (
    EXTRA_FILE,
    NO_SPACE,
    CheckpointError,
    DiskFull,
    is_sharded_folder,
    read_checked,
    save_checkpoint,
)
from gradcache.train.checksum import files_sha256

BLOCK_CONTAINERS = (nn.ModuleList, nn.Sequential)


def is_block(module: nn.Module, parent: nn.Module | None) -> bool:
    """The default unit of sharding: an entry of a ModuleList or Sequential that holds parameters (a
    transformer layer, a ResNet bottleneck, a ConvNet stage, a layer of a projection head)."""
    return isinstance(parent, BLOCK_CONTAINERS) and any(True for _ in module.parameters())


def offload_policy(cpu_offload: bool, device: torch.device | str) -> OffloadPolicy:
    """`--cpu-offload`: sharded parameters, gradients and optimizer state live in CPU memory, and the optimizer
    steps on CPU; each block's parameters are copied to `device` when gathered. Pinned memory needs CUDA."""
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=torch.device(device).type == "cuda")


def shard_encoder(
    encoder: nn.Module,
    *,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    block: Callable[[nn.Module, nn.Module | None], bool] = is_block,
) -> nn.Module:
    """`fully_shard` every block of `encoder` (outermost blocks only), then `encoder` itself; returns `encoder`.

    Args:
        encoder: a module on its training device, not yet sharded; build the optimizer AFTER this call.
        reshard_after_forward: True frees each block's gathered parameters after its forward, so GradCache
            all-gathers them again for every chunk in both passes; False keeps them gathered from a chunk's
            forward to its backward (and across the no-grad chunks of phase (1)): fewer all-gathers for the
            memory of the whole unsharded encoder. See benchmarks/results/sharding.md for measured counts.
        cpu_offload: see `offload_policy`.
        block: `block(module, parent) -> bool` picks the units of sharding; the default is `is_block`.

    Raises:
        ValueError: no process group (run under `torchrun`), or `encoder` is already sharded.
    """
    if not distributed.is_distributed():
        raise ValueError("--fsdp shards across ranks and needs a process group: launch with torchrun "
                         "(e.g. torchrun --nproc-per-node 2 -m gradcache ... --fsdp).")
    if callable(getattr(encoder, "set_requires_gradient_sync", None)):
        raise ValueError(f"{type(encoder).__name__} is already sharded with fully_shard; shard each encoder once.")
    device = next((p.device for p in encoder.parameters()), torch.device("cpu"))
    options = dict(reshard_after_forward=reshard_after_forward, offload_policy=offload_policy(cpu_offload, device))
    for sub in _outermost_blocks(encoder, block):
        fully_shard(sub, **options)
    fully_shard(encoder, **options)  # what is left: embeddings, final norms, projections
    return encoder


def _outermost_blocks(module: nn.Module, block: Callable) -> list[nn.Module]:
    found = []
    for child in module.children():
        if block(child, module):
            found.append(child)  # its inner containers stay inside this unit
        else:
            found.extend(_outermost_blocks(child, block))
    return found


# --- sharded checkpoints ----------------------------------------------------------------------------------
FILES_KEY = "files"  # in extra.pt: sha256 of every other file of the folder, checked by check_sharded_files


def save_sharded(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any] | None = None, previous: str | os.PathLike | None = None) -> Path:
    """Every rank writes its shards of `model` and `optimizer` to `folder` (torch.distributed.checkpoint).

    `model` holds everything trained (encoders and loss, e.g. an `nn.ModuleDict`); `optimizer` steps exactly
    its parameters. Keys are parameter names, not ranks, so `load_sharded` reads it on any number of ranks,
    one process without a process group included. `extra` (step, arguments, scheduler; rank 0's copy is written,
    with the saving `world_size` and the sha256 of every shard file, to `extra.pt` beside the shards) must load
    with `weights_only=True`. The shards go to `<folder>.partial`, which rank 0 then renames into place, first
    renaming the folder it replaces to `previous` (when given; else that one is deleted), so a crash mid-save
    leaves a whole checkpoint. Call on every rank, with a folder every rank can reach.

    Raises:
        DiskFull: no space left for the shards (on any rank); the partial folder is removed.
    """
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    replaced = Path(previous) if previous is not None else folder.with_name(folder.name + ".old")
    grouped = distributed.is_distributed()
    leader = distributed.rank() == 0
    if leader:
        shutil.rmtree(partial, ignore_errors=True)  # what a crashed save left
    if grouped:
        dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial), no_dist=not grouped)
        if leader:
            files = files_sha256(partial)
            save_checkpoint({**(extra or {}), "world_size": distributed.world_size(), FILES_KEY: files},
                            partial / EXTRA_FILE)
    except Exception as error:
        if leader:
            shutil.rmtree(partial, ignore_errors=True)
        if _out_of_space(error) and not isinstance(error, DiskFull):
            raise DiskFull(folder.parent, _folder_size(folder), shutil.disk_usage(folder.parent).free) from error
        raise
    if leader:
        if folder.exists():
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(folder, replaced)  # until the next rename the run folder's resolver reads `previous`
        os.replace(partial, folder)
        if previous is None:
            shutil.rmtree(replaced, ignore_errors=True)
    if grouped:
        dist.barrier()  # nobody reads the folder before it is whole
    return folder


def _out_of_space(error: BaseException | None) -> bool:
    """An ENOSPC anywhere in `error`'s chain, or in the per-rank failures torch.distributed.checkpoint gathers."""
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return True
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict) and any(_out_of_space(getattr(f, "exc", f)) for f in failures.values()
                                              if isinstance(getattr(f, "exc", f), BaseException)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def check_sharded_files(folder: str | os.PathLike) -> None:
    """Raise CheckpointError unless `folder` is a whole sharded checkpoint: `extra.pt` passes its checksum, and
    every shard file named in it is there with the sha256 it was written with (folders written before these
    checksums are checked for `extra.pt` alone)."""
    folder = _resolve_sharded(Path(folder))
    expected = read_checked(folder / EXTRA_FILE).get(FILES_KEY)
    if expected is None:
        return
    actual = files_sha256(folder, exclude=(EXTRA_FILE,))
    for name, digest in expected.items():
        if name not in actual:
            raise CheckpointError(f"sharded checkpoint {str(folder)!r} lacks its file {name}")
        if actual[name] != digest:
            raise CheckpointError(f"sharded checkpoint {str(folder)!r}: {name} fails its checksum (truncated, or "
                                  "changed after it was written)")


def sharded_extra(folder: str | os.PathLike) -> dict[str, Any]:
    """The `extra` of a `save_sharded` folder, without a model: what `--resume` needs to rebuild the run."""
    folder = _resolve_sharded(Path(folder))
    return _extra(folder)


def load_sharded(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Read a `save_sharded` folder into `model` and `optimizer` (sharded or not, any number of ranks) and
    return its `extra` (with the `world_size` that saved it). Call on every rank, after sharding and after
    building the optimizer.

    Raises:
        CheckpointError: `folder` is not a sharded checkpoint, or it does not hold `model`'s parameters.
    """
    folder = _resolve_sharded(Path(folder))
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = _read(folder, {"model": model_state, "optimizer": optimizer_state})
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return _extra(folder)


def load_sharded_model(folder: str | os.PathLike, model: nn.Module) -> dict[str, Any]:
    """Read only the model of a `save_sharded` folder into `model` (sharded or a plain module in one process,
    as `gradcache eval` needs) and return its `extra`; the optimizer state stays on disk.

    Raises:
        CheckpointError: `folder` is not a sharded checkpoint, or it does not hold `model`'s parameters.
    """
    folder = _resolve_sharded(Path(folder))
    state = _read(folder, {"model": get_model_state_dict(model)})
    set_model_state_dict(model, state["model"])
    return _extra(folder)


def check_sharded_model(folder: str | os.PathLike, model: nn.Module) -> None:
    """Raise CheckpointError unless the sharded checkpoint `folder` holds every parameter of `model`."""
    folder = _resolve_sharded(Path(folder))
    _check_holds(folder, get_model_state_dict(model))


def _check_holds(folder: Path, model_state: dict[str, Any]) -> None:
    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    missing = sorted(k for k in model_state if f"model.{k}" not in stored)
    if missing:
        raise CheckpointError(f"{str(folder)!r} does not hold parameters {missing[:5]}"
                              f"{' and more' if len(missing) > 5 else ''}: it was saved from another model")
    for key, value in model_state.items():
        size = getattr(stored[f"model.{key}"], "size", None)  # tensors carry their global size, other entries none
        if isinstance(value, torch.Tensor) and size is not None and tuple(size) != tuple(value.shape):
            raise CheckpointError(f"{str(folder)!r} holds {key} of shape {tuple(size)}, the model has "
                                  f"{tuple(value.shape)}: it was saved from another model")


def _read(folder: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Fill `state` (its "model" entry a model state dict) in place from `folder`, after checking that the folder
    holds every parameter of that model."""
    _check_holds(folder, state["model"])
    dcp.load(state, checkpoint_id=str(folder), no_dist=not distributed.is_distributed())
    return state


def _extra(folder: Path) -> dict[str, Any]:
    """`extra.pt` as the caller of save_sharded gave it (with `world_size`), checked, without the shard checksums."""
    return {k: v for k, v in read_checked(folder / EXTRA_FILE).items() if k != FILES_KEY}


def _resolve_sharded(folder: Path) -> Path:
    """`folder`, if it is a sharded checkpoint (choosing between `last.dcp` and `previous.dcp` is
    `gradcache.train.run_checkpoint`'s)."""
    if not is_sharded_folder(folder):
        hint = (" it is a single-file checkpoint: resume without --fsdp" if folder.is_file()
                else " give the folder that save_sharded wrote (it holds .metadata and extra.pt)")
        raise CheckpointError(f"{str(folder)!r} is not a sharded (torch.distributed.checkpoint) checkpoint;{hint}")
    return folder


# --- 8-bit AdamW -------------------------------------------------------------------------------------------
def check_8bit_adamw(device: torch.device | str) -> None:
    """Step bitsandbytes' 8-bit AdamW once on a 4096-element probe on `device` (the smallest tensor it quantises).

    Raises:
        ImportError: bitsandbytes is not installed.
        RuntimeError: this bitsandbytes has no 8-bit AdamW for `device`; the message names the device and the
            way out.
    """
    import bitsandbytes

    device = torch.device(device)
    probe = nn.Parameter(torch.zeros(4096, device=device))
    probe.grad = torch.ones_like(probe)
    try:
        bitsandbytes.optim.AdamW8bit([probe], lr=1e-3).step()
    except Exception as error:  # backends fail with RuntimeError, NotImplementedError or their own types
        raise RuntimeError(
            f"bitsandbytes {getattr(bitsandbytes, '__version__', '?')} has no 8-bit AdamW for device "
            f"{device.type!r} ({type(error).__name__}: {error}); it needs a CUDA GPU or a bitsandbytes build with a "
            f"backend for {device.type!r}. Use --optimizer adamw, or --cpu-offload with --fsdp to save memory."
        ) from error


def adamw_8bit(groups: list[dict[str, Any]], lr: float, device: torch.device | str | None = None
               ) -> torch.optim.Optimizer:
    """AdamW with 8-bit moments (bitsandbytes' `AdamW8bit`, block-wise quantised; tensors under 4096 elements
    keep 32-bit moments) over parameter `groups` (as `gradcache.train.optim.parameter_groups` builds them), on
    `device` (default: that of the first parameter).

    Raises:
        ImportError: bitsandbytes is not installed.
        ValueError: parameters sharded by FSDP2 (DTensor), which bitsandbytes' kernels do not read.
        RuntimeError: this bitsandbytes cannot step an 8-bit AdamW on `device` (checked with a 4096-element
            probe before the optimizer is built); the message names the device and the way out.
    """
    if any(isinstance(p, DTensor) for g in groups for p in g["params"]):  # bitsandbytes 0.50 fails mid-step
        raise ValueError("--optimizer adamw8bit cannot step parameters sharded by --fsdp (DTensor): bitsandbytes' "
                         "kernels read plain tensors. Use --optimizer adamw with --fsdp (and --cpu-offload to move "
                         "its state to CPU memory), or 8-bit AdamW without --fsdp.")
    try:
        import bitsandbytes
    except ImportError as error:
        raise ImportError("--optimizer adamw8bit needs bitsandbytes: pip install bitsandbytes (or choose "
                          "--optimizer adamw)") from error
    params = [p for g in groups for p in g["params"]]
    check_8bit_adamw(device if device is not None else (params[0].device if params else "cpu"))
    return bitsandbytes.optim.AdamW8bit([{k: v for k, v in g.items() if k != "adapt"} for g in groups], lr=lr)
