"""What phase (3)'s recomputation check costs: GradCache steps with `check_recompute` on and off, on the SimCLR
workload of the frontier benchmark (conv encoder, random views), timed round robin in one process.

The check is one reduction and one host sync per re-encoded chunk; every chunk is re-encoded here (no
memory_budget), the most checks a step can make. Prints the median step time of each, their ratio and the load
average; under load the ratio still holds, since the load falls on both alike.

    python -m benchmarks.recompute_check                       # CPU, batch 256, chunk 32, 9 rounds
    python -m benchmarks.recompute_check --device cuda --batch 1024 --chunk 64 --rounds 21
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch

from benchmarks.arguments import HelpFormatter
from benchmarks.round_robin import medians, per_round_ratio, round_robin
from benchmarks.workloads import build_workload
from gradcache import GradCache


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--batch", type=int, default=256, help="examples per step")
    parser.add_argument("--chunk", type=int, default=32, help="rows per chunk")
    parser.add_argument("--image-size", type=int, default=32, help="side of the random input images")
    parser.add_argument("--rounds", type=int, default=9, help="timing rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (0: leave torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    workload = build_workload({"task": "simclr", "model": "convnet", "image_size": args.image_size,
                               "batch": args.batch, "strategy": "gradcache", "seed": 0}, device)
    steps = {}
    for name, setting in (("check_on", True), ("check_off", False)):
        strategy = GradCache(workload.strategy_encoders, workload.loss, args.chunk, check_recompute=setting)

        def step(strategy: GradCache = strategy) -> None:
            strategy.step(*workload.inputs)
            workload.zero_grad()
        steps[name] = step
    load_before = os.getloadavg()
    times = round_robin(steps, args.rounds, device)
    seconds = medians(times)
    load_after = os.getloadavg()
    for name, value in seconds.items():
        print(f"{name:10s} {value:.4f} s/step (median of {args.rounds})")
    print(f"on/off {per_round_ratio(times, 'check_on', ['check_off']):.4f} (median per round)  batch {args.batch} chunk {args.chunk} "
          f"{args.device} threads {args.threads}; load average (1, 5, 15 min) before {load_before}, after {load_after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
