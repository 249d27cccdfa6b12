"""Sharding what does not fit, for `torchrun` runs: FSDP2 block by block, with optional CPU offload.

Memory per rank for P parameters in float32 with AdamW (4 bytes each for parameter, gradient and two moments):
DDP holds 16 P; FSDP holds 16 P / world_size plus the gathered parameters of one block at a time (of every
block while a chunk's forward runs with `reshard_after_forward=False`); CPU offload moves the sharded
parameters, gradients and optimizer state to CPU memory. Sharded checkpoints: gradcache/train/checkpoints/sharded.py;
8-bit moments: gradcache/train/optim/adamw8bit.py.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from gradcache import distributed

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
