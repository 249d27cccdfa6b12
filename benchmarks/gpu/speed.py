"""Section `speed`: GradCache with the recompute check on and off against NaiveAccumulation on the same towers,
batch and chunk size, timed round robin (`benchmarks/round_robin.py`): medians over rounds and the per-round
ratio to naive. GradCache encodes every chunk twice, so about 4/3 of naive's time is its floor."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.sizes import Sizes, TowerSize
from benchmarks.gpu.towers import make_batch, make_towers, step_flops, strategy_plan
from benchmarks.round_robin import medians, per_round_ratio, round_robin
from gradcache import GradCache, NaiveAccumulation, losses


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    size, rounds = sizes.speed, sizes.speed_rounds
    plan = max(strategy_plan(size, "gradcache"), strategy_plan(size, "naive"))
    flops = (rounds + 1) * (2 * step_flops(size, recompute=True) + step_flops(size, recompute=False))
    return [Case("speed", "gradcache_vs_naive", plan, estimated_seconds(flops, device), _timed(size, rounds))]


def _timed(size: TowerSize, rounds: int) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        towers = list(make_towers(size, device))
        loss = losses.ClipLoss(temperature=0.07, learnable=True).to(device)
        batch = make_batch(size, device)
        strategies = {"gradcache_check_on": GradCache(towers, loss, size.chunk),
                      "gradcache_check_off": GradCache(towers, loss, size.chunk, check_recompute=False),
                      "naive": NaiveAccumulation(towers, loss, size.chunk)}

        def step_of(strategy: Any) -> Callable[[], None]:
            def step() -> None:
                strategy.step(*batch)
                for module in (*towers, loss):
                    module.zero_grad(set_to_none=True)
            return step

        times = round_robin({name: step_of(s) for name, s in strategies.items()}, rounds, device)
        ratios = {name: per_round_ratio(times, name, ["naive"]) for name in strategies if name != "naive"}
        return {"step_s": medians(times)["gradcache_check_on"], "seconds": medians(times), "ratio_to_naive": ratios,
                "rounds": rounds}
    return run
