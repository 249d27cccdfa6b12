"""Section `replay`: dropout replayed exactly in training mode, on the device's generator, for the fused SDPA
dropout and `nn.Dropout`, in float32, bf16 and fp16 with a GradScaler: GradCache, CachedLoss and GradCache with
`chunk_tokens`, each against the same strategy and chunking with every graph kept (`memory_budget` holding all),
which draws each mask once. Two negative controls: with the replay turned off (the random state not restored
in phase (3)) the gradient must differ, and the recompute check must raise."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.sizes import Sizes, TowerSize
from benchmarks.gpu.towers import (activation_bytes_per_row, gradients, make_batch, make_towers, max_rel_error,
                                   step_flops, strategy_plan)
from gradcache import CachedLoss, GradCache, RecomputationMismatchError, losses

KEEP_EVERY_GRAPH = 2**50  # bytes: a memory_budget that holds every chunk's graph
TOLERANCE = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}  # relative to the largest gradient
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DIFFERS = 1e-3  # a negative control's error must exceed this


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    size = sizes.replay
    plan = strategy_plan(size, "gradcache", budget=2 * size.n * activation_bytes_per_row(size))  # the kept reference
    seconds = estimated_seconds(2 * step_flops(size, recompute=True), device)
    found = [Case("replay", f"{strategy}_{precision}", plan, seconds, _exactness(size, strategy, precision))
             for precision in DTYPES for strategy in ("gradcache", "cached_loss", "chunk_tokens")]
    found.append(Case("replay", "replay_off_differs", plan, seconds, _replay_off_differs(size)))
    found.append(Case("replay", "replay_off_check_raises", plan, seconds, _replay_off_check_raises(size)))
    return found


def _step(size: TowerSize, device: torch.device, strategy: str, precision: str,
          **options: Any) -> tuple[list[torch.Tensor], float]:
    """Every parameter's gradient after one step on the replay batch, and its seconds (towers in training mode,
    the same seed, so the same masks in phase (1))."""
    import time

    towers = make_towers(size, device)
    loss = losses.ClipLoss(temperature=0.07, learnable=True).to(device)
    batch = make_batch(size, device)
    dtype = DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12) if precision == "fp16" else None
    if strategy == "chunk_tokens":
        options["chunk_tokens"] = size.chunk * size.length // 4
    torch.manual_seed(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    if strategy == "cached_loss":
        value = CachedLoss(list(towers), loss, size.chunk, autocast_dtype=dtype, **options)(*batch)
        (scaler.scale(value) if scaler is not None else value).backward()
    else:
        GradCache(list(towers), loss, size.chunk, autocast_dtype=dtype, scaler=scaler, **options).step(*batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return gradients([*towers, loss]), time.perf_counter() - started


def _exactness(size: TowerSize, strategy: str, precision: str) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        want, _ = _step(size, device, strategy, precision, memory_budget=KEEP_EVERY_GRAPH)
        got, seconds = _step(size, device, strategy, precision)
        error, tolerance = max_rel_error(got, want), TOLERANCE[precision]
        failure = f"max_rel_error {error:.3g} > {tolerance}" if error > tolerance else None
        return {"step_s": seconds, "max_rel_error": error, "tolerance": tolerance, "failure": failure}
    return run


@contextlib.contextmanager
def _replay_off():
    """Phase (3) re-encodes under the generators as they are: other dropout masks than phase (1) drew."""
    from gradcache.random_state import RandomState

    with mock.patch.object(RandomState, "replay", lambda self: contextlib.nullcontext()):
        yield


def _replay_off_differs(size: TowerSize) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        want, _ = _step(size, device, "gradcache", "fp32", memory_budget=KEEP_EVERY_GRAPH)
        with _replay_off():
            got, seconds = _step(size, device, "gradcache", "fp32", check_recompute=False)
        error = max_rel_error(got, want)
        failure = None if error > DIFFERS else f"max_rel_error {error:.3g} <= {DIFFERS}: the replay is not what is tested"
        return {"step_s": seconds, "max_rel_error": error, "tolerance": f"> {DIFFERS}", "failure": failure}
    return run


def _replay_off_check_raises(size: TowerSize) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        try:
            with _replay_off():
                _step(size, device, "gradcache", "fp32")
        except RecomputationMismatchError as error:
            return {"raised": str(error).splitlines()[0][:200]}
        return {"failure": "the recompute check did not raise with the replay off"}
    return run
