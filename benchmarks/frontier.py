"""Step time against peak memory: the frontier a user picks from, for the SimCLR conv encoder and for text with
the pretrained all-MiniLM-L6-v2 on real sentences of long-tailed length.

Configurations: FullBatch, NaiveAccumulation (and, as the floor of keeping every graph, accumulation that holds
every micro-batch's graph until one backward at the end), GradCache with `memory_budget` at 0, 25, 50, 75 and
100% of the full batch's graph, and (timed only) one chunked forward without a graph, the unit of GradCache's
extra work; for text also `chunk_tokens` against fixed chunks with `trim_padding`, and sentence-transformers'
CachedMultipleNegativesRankingLoss with and without its `mini_batch_num_tokens`.
Memory: a fresh process per configuration (`torch.cuda.max_memory_allocated` on CUDA; on CPU peak RSS with
every block of 64 KiB or more mapped on its own, `fresh_process.LIVE_TENSORS_ENV`, so that it follows the live
tensors rather than the heap's fragmentation).
Time: every configuration in one process, round robin (`benchmarks.round_robin`), the median of `--rounds` rounds;
the targets are medians of per-round ratios; load average recorded.

    python -m benchmarks.frontier --workload simclr                       # both passes, CPU
    python -m benchmarks.frontier --workload text --batch 256 --chunk 32
    python -m benchmarks.frontier --workload text --only memory           # or --only time
    python -m benchmarks.frontier --workload clip_frozen --batch 256 --chunk 32

Every point says when it starts and how it ended on stderr; a memory point that fails (an error in its
child, an OOM kill, a budget) prints the child's error there and makes the run exit with status 1, after the
CSV and PNG of what did run are written.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks import frontier_clip
from benchmarks.atomic_output import save_figure
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, run_point
from benchmarks.frontier_workloads import (GRAPH_BYTES, GRAPHS_KEPT, WORKLOADS, build_steps, configuration_names,
                                          needs_graph_bytes)
from benchmarks.flags import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, print_table, write_csv
from benchmarks.round_robin import medians, per_round_ratio, round_robin

MB = 2**20
REFERENCE = "nograd_forward"  # phase (1) alone: one chunked forward without a graph
TIMED_ONLY = (REFERENCE, *frontier_clip.REFERENCES)  # units of comparison, not training steps: no memory point
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
    parser.add_argument("--max-length", type=int, default=256,
                        help="text: tokenizer truncation; clip_frozen: the text tower's tokens per caption")
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
    if point["config"] == GRAPH_BYTES:
        return {"status": "ok", **info[GRAPH_BYTES]}
    budget = int(point["memory_budget_gb"] * 2**30) if point["memory_budget_gb"] else None
    memory = PeakMemory(device, budget)
    steps[point["config"]]()
    result = {"status": "ok", "peak_mb": memory.peak_above_baseline() / MB, **info.get(point["config"], {})}
    memory.stop()
    return result


def target_lines(workload: str, times: dict[str, list[float]], peaks: dict[str, float]) -> list[str]:
    """The issue's targets as measured by this run (those whose configurations ran), each a median of per-round
    ratios."""
    if workload == "clip_frozen":
        return frontier_clip.target_lines(times)
    lines = []

    def ratio(numerator: str, *denominator: str) -> float | None:
        return per_round_ratio(times, numerator, denominator) if {numerator, *denominator} <= set(times) else None

    if (value := ratio("budget_100", "naive")) is not None:
        lines.append(f"budget 100%: {value:.3f} x naive (target <= 1.05)")
    if (value := ratio("budget_100", GRAPHS_KEPT)) is not None:
        lines.append(f"budget 100%: {value:.3f} x naive holding every graph (what keeping the graphs costs by "
                     "itself, the floor of any exact method that keeps them)")
    if (value := ratio("budget_100", "full_batch")) is not None:
        lines.append(f"budget 100%: {value:.3f} x full batch (target <= 1)")
    if (value := ratio("budget_0", "naive", REFERENCE)) is not None:
        lines.append(f"budget 0: {value:.3f} x (naive + one no-grad forward) (target <= 1.03)")
    if (value := ratio("budget_50", "naive", REFERENCE)) is not None:
        forwards = statistics.median((b - n) / f for b, n, f in zip(times["budget_50"], times["naive"],
                                                                    times[REFERENCE]))
        lines.append(f"budget 50%: naive + {forwards:.2f} x one no-grad forward (target <= 0.6; "
                     f"{value:.3f} x (naive + one forward))")
    if (value := ratio("budget_0", "chunk_tokens")) is not None:
        memory = (f", peak {peaks['chunk_tokens']:.0f} vs {peaks['budget_0']:.0f} MiB"
                  if {"chunk_tokens", "budget_0"} <= set(peaks) else "")
        lines.append(f"chunk_tokens: {value:.2f} x the throughput of fixed chunks with trim_padding "
                     f"(budget_0){memory} (target >= 1.3; >= 2 on text_outliers)")
    for ours, theirs in (("chunk_tokens", "st_cached_tokens"), ("chunk_tokens_4x", "st_cached_tokens")):
        if (value := ratio(theirs, ours)) is not None:
            memory = f", peak {peaks[ours]:.0f} vs {peaks[theirs]:.0f} MiB" if {ours, theirs} <= set(peaks) else ""
            lines.append(f"{ours}: {value:.2f} x the throughput of sentence-transformers' mini_batch_num_tokens"
                         f"{memory} (target >= 1 at equal peak memory)")
    return lines


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
    failed = []
    if args.only != "time" and any(needs_graph_bytes(name) for name in names):
        _say("the full batch's graph, in a fresh process (the budgets' 100%) ...")
        result = run_point(__spec__.name, {**settings, "config": GRAPH_BYTES}, args.time_budget_s)
        if result.get("status") != "ok":
            _say(f"FAILED measuring the full batch's graph: {result}")
            return 1
        settings["graph_bytes"] = result["graph_bytes"]
    if args.only != "time":
        for name in names:
            if name in TIMED_ONLY:  # not a training step: timed as a unit of comparison only
                continue
            _say(f"memory point {name}: a fresh process ...")
            result = run_point(__spec__.name, {**settings, "config": name}, args.time_budget_s, LIVE_TENSORS_ENV)
            rows[name].update({k: v for k, v in result.items() if k in COLUMNS})
            _say(f"memory point {name}: {result.get('status')}, {result.get('peak_mb', '-')} MiB, "
                 f"{result.get('process_s', '-')} s {result.get('error', '')}")
            if result.get("status") != "ok":
                failed.append(name)
    times: dict[str, list[float]] = {}
    if args.only != "memory":  # (a memory point's child reports its kept_fraction and chunk_tokens itself)
        steps, info = build_steps(settings, device)
        for name in names:
            rows[name].update(info.get(name, {}))
        _say(f"timing {len(names)} configurations, {args.rounds} rounds round robin ...")
        times = round_robin({name: steps[name] for name in names}, args.rounds, device)
        for name, seconds in medians(times).items():
            rows[name].update(step_s=seconds, rounds=args.rounds)
        del steps
    context = machine_context(args.threads, args.device)
    table = [{**row, **context} for row in rows.values()]
    folder = output_folder(args)
    write_csv(folder / f"{args.name}_{args.workload}.csv", table, COLUMNS)
    print_table(table, ["config", "status", "peak_mb", "step_s", "kept_fraction", "chunk_tokens", "loadavg_1m"])
    peaks = {row["config"]: row["peak_mb"] for row in table if _number(row.get("peak_mb"))}
    for line in target_lines(args.workload, times, peaks):
        print(line)
    plot_frontier(folder / f"{args.name}_{args.workload}.png", table, f"{args.workload}: batch {args.batch}, "
                  f"chunk {args.chunk}, {args.device}, load {context['loadavg_1m']}")
    print(f"wrote {folder}/{args.name}_{args.workload}.csv and .png")
    if failed:
        statuses = ", ".join(f"{name} ({rows[name]['status']})" for name in failed)
        _say(f"FAILED memory points: {statuses}; their errors are above and in the CSV's error column")
        return 1
    return 0


def plot_frontier(path: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Each configuration as a labelled point at (peak memory, step time); the GradCache budgets joined."""
    from benchmarks.report import plt

    figure, axis = plt.subplots(figsize=(7, 4.8))
    budgets = [r for r in rows if str(r["config"]).startswith("budget_") and _plottable(r)]
    if budgets:
        axis.plot([r["peak_mb"] for r in budgets], [r["step_s"] for r in budgets], "-", color="tab:blue", alpha=0.5)
    points = [r for r in rows if _plottable(r) and r["config"] not in TIMED_ONLY]
    for row, (dx, dy, align) in zip(points, _label_offsets(points)):
        axis.plot(row["peak_mb"], row["step_s"], "o")
        axis.annotate(row["config"], (row["peak_mb"], row["step_s"]), fontsize=8, xytext=(dx, dy),
                      textcoords="offset points", ha=align)
    axis.set_xlabel("peak memory above baseline (MiB)")
    axis.set_ylabel("step time, median (s)")
    axis.grid(True, alpha=0.3)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)


def _label_offsets(points: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(x offset, y offset in points, alignment) of each label, so that labels of points close together (within
    12% of the width and 4% of the height) do not overlap: the first to the upper right, the second to the lower
    right, the others to the left, stacked downwards."""
    if not points:  # a memory-only or time-only run: nothing to label
        return []
    xs, ys = [r["peak_mb"] for r in points], [r["step_s"] for r in points]
    width, height = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    offsets: list[tuple[int, int, str]] = [(4, 4, "left")] * len(points)
    placed: list[int] = []
    for i in sorted(range(len(points)), key=lambda i: -ys[i]):
        near = sum(abs(xs[i] - xs[j]) < 0.12 * width and abs(ys[i] - ys[j]) < 0.04 * height for j in placed)
        if near == 0:
            offsets[i] = (4, 4, "left")
        elif near == 1:
            offsets[i] = (4, -8, "left")
        else:
            offsets[i] = (-4, 4 - 10 * (near - 2), "right")
        placed.append(i)
    return offsets


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plottable(row: dict[str, Any]) -> bool:
    return _number(row.get("peak_mb")) and _number(row.get("step_s"))


if __name__ == "__main__":
    sys.exit(main())
