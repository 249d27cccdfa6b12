"""Peak memory and time of a contrastive loss's forward + backward alone: dense, strips and tiles, N doubling.

Modes: ``dense`` (the N x N logits), ``strips`` (``--tile-size`` rows against every column: the scheme before
2-D tiles, from the same code with ``column_tile_size`` >= the column count) and ``tiled`` (``--tile-size`` rows
x ``--column-tile-size`` columns, square by default). Each point runs in a fresh process (see
``fresh_process.py``): the child builds (N, D) embeddings, resets the kernel's peak-RSS mark, runs one forward +
backward and reports the peak above that baseline (CPU: peak RSS; CUDA: ``torch.cuda.max_memory_allocated``),
then times a few more runs and reports the median. A point whose predicted memory (4x its measured N/2 point
for dense, 2x otherwise) exceeds ``--memory-budget-gb`` is recorded as skipped ("would not fit") instead of run.

``--interleaved-n N`` times instead, in one process: strips against square tiles of each ``--blocks`` size,
round robin for ``--rounds`` rounds (the order rotating each round), and reports each configuration's median
and its ratio to the strips' median, with the load average of every round. Nothing here touches the network.

    python -m benchmarks.loss_memory                                  # ClipLoss, N = 1,024 ... 65,536
    python -m benchmarks.loss_memory --max-n 32768 --losses clip,siglip --modes dense,strips,tiled
    python -m benchmarks.loss_memory --sizes 32768,131072,262144 --modes tiled --time-budget-s 7200
    python -m benchmarks.loss_memory --interleaved-n 32768 --blocks 512,1024,2048 --rounds 9
    python -m benchmarks.loss_memory --device cuda --max-n 131072
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, choices, output_folder
from benchmarks.fresh_process import PeakMemory, median_time, report, reset_peak_rss, run_point
from benchmarks.report import machine_context, plot_lines, print_table, write_csv

from gradcache import losses

GB = 2**30
LOSSES = {"clip": losses.ClipLoss, "siglip": losses.SigLipLoss, "infonce": losses.InfoNCE, "ntxent": losses.NTXent}
MODES = ("dense", "strips", "tiled")
COLUMNS = ["loss", "mode", "n", "dim", "tile_size", "column_tile_size", "status", "peak_gb", "predicted_gb", "step_s",
           "runs", "loss_value", "process_s", "error", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m",
           "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["loss", "mode", "n", "status", "peak_gb", "predicted_gb", "step_s", "runs", "loadavg_1m",
         "over_dense_time"]
TIMING_COLUMNS = ["config", "round", "step_s", "loss_value", "loadavg_1m", "n", "dim", "loss", "tile_size",
                  "column_tile_size", "threads", "cpu_count", "loadavg_5m", "torch_version", "timestamp_utc"]
SUMMARY = ["config", "tile_size", "column_tile_size", "median_s", "over_strips", "min_s", "max_s", "rounds"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--losses", default="clip", help=f"comma-separated subset of {','.join(LOSSES)}")
    parser.add_argument("--min-n", type=int, default=1024, help="first batch size of the doubling sweep")
    parser.add_argument("--max-n", type=int, default=65536, help="last batch size of the doubling sweep")
    parser.add_argument("--dim", type=int, default=256, help="embedding width D")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated batch sizes, instead of the doubling sweep --min-n ... --max-n")
    parser.add_argument("--modes", default="dense,tiled", help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--tile-size", type=int, default=1024, help="rows per tile (strips and tiles)")
    parser.add_argument("--column-tile-size", type=int, default=None,
                        help="columns per tile of the tiled mode (default: --tile-size, square tiles)")
    parser.add_argument("--interleaved-n", type=int, default=None,
                        help="time strips against tiles at this N in one process instead of the memory sweep")
    parser.add_argument("--blocks", default="512,1024,2048",
                        help="square tile sizes the interleaved timing compares with the strips")
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds of the interleaved timing")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the measured one (median)")
    parser.add_argument("--long-run-s", type=float, default=20.0,
                        help="a point whose first run takes longer reports that run's time alone")
    # dense points predicted above --memory-budget-gb are skipped without running
    add_shared_options(parser, "loss_memory", threads=os.cpu_count(), memory_budget_gb=12.0, time_budget_s=900.0)
    return parser


def column_tiles(mode: str, n: int, column_tile_size: int | None) -> int | None:
    """The loss's column_tile_size for a mode: 2N columns is every column of every loss here (NT-Xent's 2N)."""
    return 2 * n if mode == "strips" else column_tile_size


def make_step(loss_name: str, n: int, dim: int, tile_size: int | None, column_tile_size: int | None,
              device: torch.device) -> Callable[[], float]:
    """One forward + backward of the loss on fixed correlated (N, D) embeddings; returns the loss value."""
    loss_fn = LOSSES[loss_name](tile_size=tile_size, column_tile_size=column_tile_size).to(device)
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(n, dim, generator=generator)
    second = first + 0.5 * torch.randn(n, dim, generator=generator)
    embeddings = [x.to(device).requires_grad_() for x in (first, second)]

    def step() -> float:
        for x in embeddings:
            x.grad = None
        loss_fn.zero_grad(set_to_none=True)
        loss = loss_fn(*embeddings)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return float(loss.detach())

    return step


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: one forward + backward measured for memory, then the median time of a few more."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    dense = point["mode"] == "dense"
    step = make_step(point["loss"], point["n"], point["dim"], None if dense else point["tile_size"],
                     None if dense else column_tiles(point["mode"], point["n"], point["column_tile_size"]), device)
    if device.type == "cpu":
        reset_peak_rss()
    peak = PeakMemory(device, int(point["memory_budget_gb"] * GB))
    started = time.perf_counter()
    loss_value = step()  # synchronises a GPU before it returns
    first_s = time.perf_counter() - started
    peak_bytes = peak.peak_above_baseline()
    if first_s > point["long_run_s"] or point["repeats"] < 1:
        step_s, runs = first_s, 1
    else:
        step_s, times = median_time(step, point["repeats"], 0, device)
        runs = len(times)
    return {"status": "ok", "peak_gb": peak_bytes / GB, "step_s": step_s, "runs": runs, "loss_value": loss_value}


def _sweep_sizes(args: argparse.Namespace) -> list[int]:
    if args.sizes:
        return [int(size) for size in args.sizes.split(",")]
    sizes, n = [], args.min_n
    while n <= args.max_n:
        sizes.append(n)
        n *= 2
    return sizes


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    modes = choices(args.modes, MODES, "--modes")
    for loss_name in choices(args.losses, list(LOSSES), "--losses"):
        for mode in modes:
            previous = None  # (n, peak_gb) of this series' last point that ran
            for n in _sweep_sizes(args):
                row = {"loss": loss_name, "mode": mode, "n": n, "dim": args.dim,
                       "tile_size": "" if mode == "dense" else args.tile_size,
                       "column_tile_size": "" if mode == "dense" else
                       column_tiles(mode, n, args.column_tile_size or args.tile_size),
                       **machine_context(args.threads, args.device)}
                # Dense memory grows as N^2; strips as N (tile x N), tiles as N (the inputs' gradients).
                if previous is not None:
                    row["predicted_gb"] = previous[1] * (n / previous[0]) ** (2 if mode == "dense" else 1)
                if row.get("predicted_gb", 0.0) > args.memory_budget_gb:
                    row["status"] = f"skipped: would not fit (predicted > {args.memory_budget_gb:g} GB budget)"
                    rows.append(row)
                    continue
                point = {"loss": loss_name, "mode": mode, "n": n, "dim": args.dim, "tile_size": args.tile_size,
                         "column_tile_size": args.column_tile_size, "threads": args.threads, "device": args.device,
                         "repeats": args.repeats, "long_run_s": args.long_run_s,
                         "memory_budget_gb": args.memory_budget_gb}
                row.update(run_point(__spec__.name, point, args.time_budget_s))
                previous = (n, row["peak_gb"] if row.get("status") == "ok" else math.inf)
                print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
                rows.append(row)
    return rows


def _time_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Strips' and tiles' step time over dense step time, on their rows, where both ran."""
    dense = {(row["loss"], row["n"]): row.get("step_s") for row in rows if row["mode"] == "dense"}
    for row in rows:
        dense_s = dense.get((row["loss"], row["n"]))
        if row["mode"] != "dense" and isinstance(row.get("step_s"), float) and isinstance(dense_s, float):
            row["over_dense_time"] = row["step_s"] / dense_s


def run_interleaved(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Strips and square tiles of each --blocks size, timed round robin in this process: (per-run rows, summary)."""
    torch.set_num_threads(args.threads)
    device, n, loss_name = torch.device(args.device), args.interleaved_n, choices(args.losses, list(LOSSES),
                                                                                    "--losses")[0]
    configs = {"strips": (args.tile_size, column_tiles("strips", n, None))}
    configs.update({f"tiles {size}": (size, size) for size in (int(block) for block in args.blocks.split(","))})
    steps = {name: make_step(loss_name, n, args.dim, rows, columns, device)
             for name, (rows, columns) in configs.items()}
    for step in steps.values():  # warm-up: first-touch allocations, thread pools
        step()
    runs: list[dict[str, Any]] = []
    names = list(configs)
    for round_index in range(args.rounds):
        shift = round_index % len(names)  # rotate, so no configuration always runs first (or after the same one)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            loss_value = steps[name]()
            row = {"config": name, "round": round_index, "step_s": time.perf_counter() - started,
                   "loss_value": loss_value, "n": n, "dim": args.dim, "loss": loss_name,
                   "tile_size": configs[name][0], "column_tile_size": configs[name][1],
                   **machine_context(args.threads, args.device)}
            print(json.dumps({key: row[key] for key in ("config", "round", "step_s", "loadavg_1m")}), flush=True)
            runs.append(row)
    summary = []
    for name in names:
        times = sorted(row["step_s"] for row in runs if row["config"] == name)
        summary.append({"config": name, "tile_size": configs[name][0], "column_tile_size": configs[name][1],
                        "median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1],
                        "rounds": len(times)})
    for row in summary:
        row["over_strips"] = row["median_s"] / summary[0]["median_s"]
    return runs, summary


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    if args.interleaved_n is not None:
        runs, summary = run_interleaved(args)
        output_dir = output_folder(args)
        write_csv(output_dir / f"{args.name}_interleaved.csv", runs, TIMING_COLUMNS)
        write_csv(output_dir / f"{args.name}_interleaved_summary.csv", summary, SUMMARY)
        print_table(summary, SUMMARY)
        print("load average (1, 5, 15 min) at the end:", os.getloadavg())
        return summary
    rows = run_sweep(args)
    _time_ratios(rows)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS + ["over_dense_time"])
    for row in rows:
        row["series"] = f"{row['loss']} {row['mode']}"
    plot_lines(output_dir / f"{args.name}.png", rows, "n", [("peak_gb", "peak memory above baseline (GB)"),
               ("step_s", "forward + backward time (s)")], "series",
               f"loss forward+backward, D={args.dim}, tile {args.tile_size} x "
               f"{args.column_tile_size or args.tile_size} (strips: all columns), {args.device}, "
               f"{args.threads} threads")
    print_table(rows, TABLE)
    return rows


if __name__ == "__main__":
    main()
