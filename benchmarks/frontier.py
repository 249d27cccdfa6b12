"""Step time against peak memory: the frontier a user picks from, for the SimCLR conv encoder and for text with
the pretrained all-MiniLM-L6-v2 on real sentences of long-tailed length.

Configurations: FullBatch, NaiveAccumulation, GradCache with `memory_budget` at 0, 25, 50, 75 and 100% of the
full batch's graph, and (timed only) one chunked forward without a graph, the unit of GradCache's extra work; for text also `chunk_tokens` against fixed chunks with `trim_padding`, and
sentence-transformers' CachedMultipleNegativesRankingLoss with and without its `mini_batch_num_tokens`.
Memory: a fresh process per configuration (peak RSS on CPU, `torch.cuda.max_memory_allocated` on CUDA).
Time: every configuration in one process, round robin, the median of `--rounds` rounds, load average recorded.

    python -m benchmarks.frontier --workload simclr                       # both passes, CPU
    python -m benchmarks.frontier --workload text --batch 256 --chunk 32
    python -m benchmarks.frontier --workload text --only memory           # or --only time
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.fresh_process import PeakMemory, median_time, report, run_point
from benchmarks.frontier_workloads import WORKLOADS, build_steps, configuration_names
from benchmarks.options import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, print_table, write_csv

MB = 2**20
REFERENCE = "nograd_forward"  # phase (1) alone: one chunked forward without a graph
COLUMNS = ["workload", "config", "batch", "chunk", "chunk_tokens", "status", "peak_mb", "step_s", "rounds",
           "kept_fraction", "error", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m", "torch_version",
           "gradcache_version", "python_version", "timestamp_utc"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--workload", default="simclr", choices=WORKLOADS, help="what one step trains")
    parser.add_argument("--batch", type=int, default=256, help="examples per step (pairs for text)")
    parser.add_argument("--chunk", type=int, default=32, help="rows per chunk of Naive, GradCache and the peers")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="text: tokens per chunk (default: chunk x the batch's median padded length x 2)")
    parser.add_argument("--image-size", type=int, default=32, help="simclr: side of the random input images")
    parser.add_argument("--max-length", type=int, default=256, help="text: tokenizer truncation")
    parser.add_argument("--rounds", type=int, default=9, help="timing rounds (median reported)")
    parser.add_argument("--only", choices=("memory", "time"), default=None, help="run one of the two passes")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    add_shared_options(parser, "frontier", memory_budget_gb=24.0, time_budget_s=900.0)
    return parser


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"workload": args.workload, "batch": args.batch, "chunk": args.chunk, "chunk_tokens": args.chunk_tokens,
            "image_size": args.image_size, "max_length": args.max_length, "threads": args.threads,
            "device": args.device, "memory_budget_gb": args.memory_budget_gb}


def memory_point(point: dict[str, Any]) -> dict[str, Any]:
    """In the fresh process: build one configuration (model, inputs: the baseline), then measure one step's peak
    above it. No warm-up step: on CPU the peak is a high-water mark that a warm-up would already have set."""
    if point["threads"]:
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    steps, info = build_steps(point, device, only=point["config"])
    budget = int(point["memory_budget_gb"] * 2**30) if point["memory_budget_gb"] else None
    memory = PeakMemory(device, budget)
    steps[point["config"]]()
    result = {"status": "ok", "peak_mb": memory.peak_above_baseline() / MB, **info.get(point["config"], {})}
    memory.stop()
    return result


def round_robin(steps: dict[str, Callable[[], None]], rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds per step of each configuration, timed in turn so the machine's load falls on all alike."""
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(median_time(step, 1, 0, device)[0])  # one timed call
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:  # the child of a memory point
        report(memory_point(json.loads(args.point)))
        return 0
    settings = settings_of(args)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.configs.split(",") if args.configs else configuration_names(args.workload)
    unknown = sorted(set(names) - set(configuration_names(args.workload)))
    if unknown:
        print(f"unknown configurations {unknown}; choose from {configuration_names(args.workload)}", file=sys.stderr)
        return 2
    rows = {name: {"workload": args.workload, "config": name, "batch": args.batch, "chunk": args.chunk,
                   "status": "ok"} for name in names}
    # Memory first, while this process holds no model: a child's peak RSS counts from its parent's size at fork.
    if args.only != "time":
        for name in names:
            if name == REFERENCE:  # not a training step: timed as the unit of GradCache's extra work only
                continue
            result = run_point(__spec__.name, {**settings, "config": name}, args.time_budget_s)
            rows[name].update({k: v for k, v in result.items() if k in COLUMNS})
    steps, info = build_steps(settings, device)
    for name in names:
        rows[name].update(info.get(name, {}))
    if args.only != "memory":
        timed = round_robin({name: steps[name] for name in names}, args.rounds, device)
        for name, seconds in timed.items():
            rows[name].update(step_s=seconds, rounds=args.rounds)
    del steps
    context = machine_context(args.threads, args.device)
    table = [{**row, **context} for row in rows.values()]
    folder = output_folder(args)
    write_csv(folder / f"{args.name}_{args.workload}.csv", table, COLUMNS)
    print_table(table, ["config", "status", "peak_mb", "step_s", "kept_fraction", "chunk_tokens", "loadavg_1m"])
    plot_frontier(folder / f"{args.name}_{args.workload}.png", table, f"{args.workload}: batch {args.batch}, "
                  f"chunk {args.chunk}, {args.device}, load {context['loadavg_1m']}")
    print(f"wrote {folder}/{args.name}_{args.workload}.csv and .png")
    return 0


def plot_frontier(path: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Each configuration as a labelled point at (peak memory, step time); the GradCache budgets joined."""
    from benchmarks.report import plt

    figure, axis = plt.subplots(figsize=(7, 4.8))
    budgets = [r for r in rows if str(r["config"]).startswith("budget_") and _plottable(r)]
    if budgets:
        axis.plot([r["peak_mb"] for r in budgets], [r["step_s"] for r in budgets], "-", color="tab:blue", alpha=0.5)
    for row in rows:
        if _plottable(row) and row["config"] != REFERENCE:
            axis.plot(row["peak_mb"], row["step_s"], "o")
            axis.annotate(row["config"], (row["peak_mb"], row["step_s"]), fontsize=8, xytext=(4, 4),
                          textcoords="offset points")
    axis.set_xlabel("peak memory above baseline (MiB)")
    axis.set_ylabel("step time, median (s)")
    axis.grid(True, alpha=0.3)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plottable(row: dict[str, Any]) -> bool:
    return isinstance(row.get("peak_mb"), (int, float)) and isinstance(row.get("step_s"), (int, float))


if __name__ == "__main__":
    sys.exit(main())
