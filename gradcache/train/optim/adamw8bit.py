"""`--optimizer adamw8bit`: bitsandbytes' AdamW with 8-bit moments (2 P bytes of optimizer state instead of
8 P for P float32 parameters), checked on the device before a run relies on it."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


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
    keep 32-bit moments) over parameter `groups` (as `gradcache.train.optim.optimizers.parameter_groups` builds them), on
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
