"""Peak memory against negatives per anchor for FullBatch, NaiveAccumulation, GradCache (dense and tiled loss),
batch sizes doubling from 64; each point in a fresh process.

Step time: ``--strategies interleaved --batch 512 --chunk 32`` times a Naive step, a GradCache step and one
chunked no-grad forward round robin in one process (the only extra work GradCache does over accumulation), and
reports the median of the per-round (GradCache - Naive) / no-grad forward.

    python -m benchmarks.negatives_vs_memory                      # CPU sweep, a few minutes
    python -m benchmarks.negatives_vs_memory --batch 1024 --chunk 32
    python -m benchmarks.negatives_vs_memory --device cuda --model resnet18 --max-batch 65536
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.fresh_process import PeakMemory, median_time, report, run_point
from benchmarks.flags import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, plot_lines, print_table, write_csv
from benchmarks.workloads import LOSS_ONLY, STRATEGIES, TASKS, build_workload, input_bytes, negatives_per_anchor

MB = 2**20
DEFAULT_STRATEGIES = [*STRATEGIES, LOSS_ONLY]
INTERLEAVED = "interleaved"  # opt-in: Naive, GradCache and the no-grad forward timed in turn in one process
COLUMNS = ["task", "model", "image_size", "strategy", "batch", "chunk", "negatives_per_anchor", "status",
           "peak_mb", "input_mb", "step_s", "naive_step_s", "nograd_forward_s", "extra_over_nograd", "steps", "warmup",
           "process_s", "error", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m", "torch_version",
           "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["strategy", "batch", "negatives_per_anchor", "status", "peak_mb", "step_s", "extra_over_nograd"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--task", default="simclr", choices=TASKS, help="SimCLR NT-Xent on two views, or CLIP")
    parser.add_argument("--model", default="convnet", help="image encoder preset of models.build_image_encoder")
    parser.add_argument("--image-size", type=int, default=32, help="side of the random input images")
    parser.add_argument("--text-length", type=int, default=32, help="CLIP: tokens per caption")
    parser.add_argument("--chunk", type=int, default=32, help="chunk (micro-batch) size of Naive and GradCache")
    parser.add_argument("--tile-size", type=int, default=256, help="rows per tile of the tiled loss")
    parser.add_argument("--min-batch", type=int, default=64, help="first batch of the doubling sweep")
    parser.add_argument("--max-batch", type=int, default=512, help="last batch of the doubling sweep")
    parser.add_argument("--batch", type=int, default=None, help="one batch only (overrides the sweep)")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help=f"comma-separated subset; '{INTERLEAVED}' times Naive, GradCache and the no-grad forward "
                             "in turn in one process (the robust ratio on a loaded machine)")
    add_shared_options(parser, "negatives_vs_memory", timed_steps=3, memory_budget_gb=6.0, time_budget_s=300.0)
    return parser


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    """In the fresh process: peak memory and median step time of one strategy at one batch."""
    if point["threads"]:  # 0 keeps torch's default (an in-process caller such as a test)
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    warm = {**point, "strategy": "gradcache" if point["strategy"] == INTERLEAVED else point["strategy"]}
    _make_step(warm, build_workload({**warm, "batch": 2}, device), chunk=1)()  # load kernels before the baseline
    budget = int(point["memory_budget_gb"] * 2**30) if point["memory_budget_gb"] else None
    memory = PeakMemory(device, budget)
    workload = build_workload(point, device)
    if point["strategy"] == INTERLEAVED:
        result = {"status": "ok", **_interleaved_times(point, workload, device)}
        result.update(peak_mb=memory.peak_above_baseline() / MB, input_mb=input_bytes(workload) / MB)
        memory.stop()
        return result
    step_s, _ = median_time(_make_step(point, workload, point["chunk"]), point["steps"], point["warmup"], device)
    result = {"status": "ok", "peak_mb": memory.peak_above_baseline() / MB, "step_s": step_s,
              "input_mb": input_bytes(workload) / MB}
    if point["strategy"] == "gradcache":
        result["nograd_forward_s"], _ = median_time(lambda: workload.encode_without_grad(point["chunk"]),
                                                    point["steps"], point["warmup"], device)
    memory.stop()
    return result


def _interleaved_times(point: dict[str, Any], workload: Any, device: torch.device) -> dict[str, float]:
    """Naive step, GradCache step and no-grad forward timed round-robin, so a change of machine load hits all
    three alike; the ratio is the median over rounds of (GradCache - Naive) / no-grad forward."""
    chunk = point["chunk"]
    runs = [_make_step({**point, "strategy": "naive"}, workload, chunk),
            _make_step({**point, "strategy": "gradcache"}, workload, chunk),
            lambda: workload.encode_without_grad(chunk)]
    rounds = [[median_time(run, 1, point["warmup"] if index == 0 else 0, device)[0] for run in runs]
              for index in range(point["steps"])]
    naive, cached, forward = ([times[i] for times in rounds] for i in range(3))
    ratios = [(c - n) / f for n, c, f in zip(naive, cached, forward)]
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    return {"naive_step_s": median(naive), "step_s": median(cached), "nograd_forward_s": median(forward),
            "extra_over_nograd": median(ratios)}


def _make_step(point: dict[str, Any], workload: Any, chunk: int) -> Callable[[], None]:
    """One training step of the point's strategy (built once), then the gradients dropped for the next."""
    if point["strategy"] == LOSS_ONLY:
        run = workload.loss_only_backward
    else:
        strategy = STRATEGIES[point["strategy"]](workload.strategy_encoders, workload.loss, chunk)
        run = lambda: strategy.step(*workload.inputs)  # noqa: E731

    def step() -> None:
        run()
        workload.zero_grad()
    return step


def sweep(args: argparse.Namespace, module: str) -> list[dict[str, Any]]:
    """Every (batch, strategy) point in its own process; a strategy over a budget skips larger batches."""
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = sorted(set(strategies) - {*DEFAULT_STRATEGIES, INTERLEAVED})
    if unknown:
        raise ValueError(f"--strategies has unknown {unknown}; choose from {[*DEFAULT_STRATEGIES, INTERLEAVED]}.")
    batches = [args.batch] if args.batch else _doubling(args.min_batch, args.max_batch)
    failed: dict[str, str] = {}
    rows = []
    for batch in batches:
        for strategy in strategies:
            chunked = strategy in ("naive", "gradcache", "gradcache_tiled", INTERLEAVED)
            chunk = min(args.chunk, batch) if chunked else batch
            point = {"task": args.task, "model": args.model, "image_size": args.image_size, "strategy": strategy,
                     "batch": batch, "chunk": chunk, "text_length": args.text_length, "tile_size": args.tile_size,
                     "steps": args.steps, "warmup": args.warmup, "threads": args.threads, "device": args.device,
                     "memory_budget_gb": args.memory_budget_gb}
            context = machine_context(args.threads, args.device)
            if strategy in failed:
                result = {"status": f"skipped ({failed[strategy]} at a smaller batch)"}
            else:
                result = run_point(module, point, args.time_budget_s)
                if result["status"] in ("oom", "over_memory_budget", "over_time_budget"):
                    failed[strategy] = result["status"]
            row = {**point, **context, **result,
                   "negatives_per_anchor": negatives_per_anchor(args.task, strategy, batch, chunk)}
            print(json.dumps({key: row.get(key) for key in TABLE}), flush=True)
            rows.append(row)
    _add_ratios(rows)
    return rows


def _doubling(first: int, last: int) -> list[int]:
    if first < 1 or last < first:
        raise ValueError(f"--min-batch={first} and --max-batch={last}: need 1 <= min-batch <= max-batch.")
    batches = [first]
    while batches[-1] * 2 <= last:
        batches.append(batches[-1] * 2)
    return batches


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """(GradCache - Naive) step time over one no-grad forward, at each batch where both ran."""
    naive = {row["batch"]: row["step_s"] for row in rows if row["strategy"] == "naive" and row["status"] == "ok"}
    for row in rows:
        if row["strategy"] == "gradcache" and row["status"] == "ok" and row["batch"] in naive:
            row["extra_over_nograd"] = (row["step_s"] - naive[row["batch"]]) / row["nograd_forward_s"]


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.point:
        report(measure_point(json.loads(args.point)))
        return 0
    rows = sweep(args, __spec__.name)
    output = output_folder(args)
    write_csv(output / f"{args.name}.csv", rows, COLUMNS)
    title = (f"{args.task} / {args.model} {args.image_size}px, chunk {args.chunk}, {args.device}, "
             f"{args.threads} threads")
    # Memory only: a point's time is measured in its own process, minutes from the others, so machine load moves
    # it; step times compared across strategies come from the interleaved point (one process, round robin).
    panels = [("peak_mb", "peak memory above baseline (MiB)")]
    ok = [row for row in rows if row["status"] == "ok"]
    plot_lines(output / f"{args.name}.png", ok, "negatives_per_anchor", panels, "strategy", title)
    # Accumulation's negatives never grow, so its points stack at one x above; by batch they spread out.
    plot_lines(output / f"{args.name}_by_batch.png", ok, "batch", panels, "strategy", title)
    print_table(rows, TABLE)
    print(f"wrote {output / args.name}.csv, .png and _by_batch.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
