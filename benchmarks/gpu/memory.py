"""Section `memory`: one step of FullBatch, NaiveAccumulation and GradCache without and with a `memory_budget`
(half of the batch's graphs) on two token towers, each measured (`torch.cuda.max_memory_allocated` above the
case's start) against its planned peak: a case fails where it measures more than its plan + 10%. Sized so
that FullBatch's plan fits an 80 GB GPU; a smaller device skips what its free memory cannot hold."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.sizes import Sizes, TowerSize
from benchmarks.gpu.towers import activation_bytes_per_row, make_batch, make_towers, step_flops, strategy_plan
from gradcache import FullBatch, GradCache, NaiveAccumulation, losses

STRATEGIES = ("full_batch", "naive", "gradcache", "gradcache_budget")


def half_the_graphs(size: TowerSize) -> int:
    """The budget of `gradcache_budget`: half of the bytes the plan gives the whole batch's graphs."""
    return size.n * activation_bytes_per_row(size)


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    size = sizes.memory
    found = []
    for name in STRATEGIES:
        if name == "gradcache_budget":
            plan = strategy_plan(size, "gradcache", budget=half_the_graphs(size))
        else:
            plan = strategy_plan(size, name)
        seconds = estimated_seconds(step_flops(size, recompute=name.startswith("gradcache")), device)
        found.append(Case("memory", name, plan, seconds, _one_step(size, name), check_memory=True))
    return found


def build(name: str, towers: list[torch.nn.Module], loss: torch.nn.Module, size: TowerSize) -> Any:
    if name == "full_batch":
        return FullBatch(towers, loss)
    if name == "naive":
        return NaiveAccumulation(towers, loss, size.chunk)
    budget = half_the_graphs(size) if name == "gradcache_budget" else None
    return GradCache(towers, loss, size.chunk, memory_budget=budget)


def _one_step(size: TowerSize, name: str) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        towers = list(make_towers(size, device))
        loss = losses.ClipLoss(temperature=0.07, learnable=True).to(device)
        strategy = build(name, towers, loss, size)
        batch = make_batch(size, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        value = strategy.step(*batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return {"step_s": time.perf_counter() - started, "loss": float(value)}
    return run
