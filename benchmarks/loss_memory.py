"""Peak memory and time of a contrastive loss's forward + backward alone, dense against tiled, N doubling.

Each point runs in a fresh process (see ``fresh_process.py``): the child builds (N, D) embeddings, resets the
kernel's peak-RSS mark, runs one forward + backward and reports the peak above that baseline (CPU: peak RSS;
CUDA: ``torch.cuda.max_memory_allocated``), then times a few more runs and reports the median. A dense point
whose predicted memory (4x its measured N/2 point; the tiled loss grows 2x) exceeds ``--memory-budget-gb`` is
recorded as skipped ("would not fit") instead of run. Nothing here touches the network.

    python -m benchmarks.loss_memory                                  # ClipLoss, N = 1,024 ... 65,536
    python -m benchmarks.loss_memory --max-n 32768 --losses clip,siglip
    python -m benchmarks.loss_memory --device cuda --max-n 131072
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.fresh_process import PeakMemory, median_time, report, run_point
from benchmarks.options import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, plot_lines, print_table, write_csv

from gradcache import losses

GB = 2**30
LOSSES = {"clip": losses.ClipLoss, "siglip": losses.SigLipLoss, "infonce": losses.InfoNCE, "ntxent": losses.NTXent}
COLUMNS = ["loss", "mode", "n", "dim", "tile_size", "status", "peak_gb", "predicted_gb", "step_s", "runs",
           "loss_value", "process_s", "error", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m",
           "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["loss", "mode", "n", "status", "peak_gb", "predicted_gb", "step_s", "runs", "tiled_over_dense_time"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--losses", default="clip", help=f"comma-separated subset of {','.join(LOSSES)}")
    parser.add_argument("--min-n", type=int, default=1024, help="first batch size of the doubling sweep")
    parser.add_argument("--max-n", type=int, default=65536, help="last batch size of the doubling sweep")
    parser.add_argument("--dim", type=int, default=256, help="embedding width D")
    parser.add_argument("--tile-size", type=int, default=1024, help="rows per strip of the tiled loss")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the measured one (median)")
    parser.add_argument("--long-run-s", type=float, default=20.0,
                        help="a point whose first run takes longer reports that run's time alone")
    # dense points predicted above --memory-budget-gb are skipped without running
    add_shared_options(parser, "loss_memory", threads=os.cpu_count(), memory_budget_gb=12.0, time_budget_s=900.0)
    return parser


def _reset_peak_rss() -> None:
    """Make the kernel's peak RSS (ru_maxrss) restart from the current RSS, so imports and setup do not count."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: one forward + backward measured for memory, then the median time of a few more."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    tile_size = point["tile_size"] if point["mode"] == "tiled" else None
    loss_fn = LOSSES[point["loss"]](tile_size=tile_size).to(device)
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(point["n"], point["dim"], generator=generator)
    second = first + 0.5 * torch.randn(point["n"], point["dim"], generator=generator)
    embeddings = [x.to(device).requires_grad_() for x in (first, second)]

    def step() -> float:
        for x in embeddings:
            x.grad = None
        loss_fn.zero_grad(set_to_none=True)
        loss = loss_fn(*embeddings)
        loss.backward()
        return float(loss.detach())

    if device.type == "cpu":
        _reset_peak_rss()
    peak = PeakMemory(device, int(point["memory_budget_gb"] * GB))
    started = time.perf_counter()
    loss_value = step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_s = time.perf_counter() - started
    peak_bytes = peak.peak_above_baseline()
    if first_s > point["long_run_s"] or point["repeats"] < 1:
        step_s, runs = first_s, 1
    else:
        step_s, times = median_time(step, point["repeats"], 0, device)
        runs = len(times)
    return {"status": "ok", "peak_gb": peak_bytes / GB, "step_s": step_s, "runs": runs, "loss_value": loss_value}


def _sweep_sizes(args: argparse.Namespace) -> list[int]:
    sizes, n = [], args.min_n
    while n <= args.max_n:
        sizes.append(n)
        n *= 2
    return sizes


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for loss_name in args.losses.split(","):
        if loss_name not in LOSSES:
            raise ValueError(f"--losses: unknown loss {loss_name!r}; choose from {', '.join(LOSSES)}")
        for mode in ("dense", "tiled"):
            previous_peak = None
            for n in _sweep_sizes(args):
                row = {"loss": loss_name, "mode": mode, "n": n, "dim": args.dim,
                       "tile_size": args.tile_size if mode == "tiled" else "",
                       **machine_context(args.threads, args.device)}
                # Dense memory grows as N^2, tiled as N (strips of tile x N): double N, predict 4x or 2x.
                if previous_peak is not None:
                    row["predicted_gb"] = previous_peak * (4 if mode == "dense" else 2)
                if row.get("predicted_gb", 0.0) > args.memory_budget_gb:
                    row["status"] = f"skipped: would not fit (predicted > {args.memory_budget_gb:g} GB budget)"
                    rows.append(row)
                    continue
                point = {"loss": loss_name, "mode": mode, "n": n, "dim": args.dim, "tile_size": args.tile_size,
                         "threads": args.threads, "device": args.device, "repeats": args.repeats,
                         "long_run_s": args.long_run_s, "memory_budget_gb": args.memory_budget_gb}
                row.update(run_point(__spec__.name, point, args.time_budget_s))
                previous_peak = row.get("peak_gb") if row.get("status") == "ok" else math.inf
                print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
                rows.append(row)
    return rows


def _time_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Tiled step time over dense step time, on the tiled row, where both ran."""
    dense = {(row["loss"], row["n"]): row.get("step_s") for row in rows if row["mode"] == "dense"}
    for row in rows:
        dense_s = dense.get((row["loss"], row["n"]))
        if row["mode"] == "tiled" and isinstance(row.get("step_s"), float) and isinstance(dense_s, float):
            row["tiled_over_dense_time"] = row["step_s"] / dense_s


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    rows = run_sweep(args)
    _time_ratios(rows)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS + ["tiled_over_dense_time"])
    for row in rows:
        row["series"] = f"{row['loss']} {row['mode']}"
    plot_lines(output_dir / f"{args.name}.png", rows, "n", [("peak_gb", "peak memory above baseline (GB)"),
               ("step_s", "forward + backward time (s)")], "series",
               f"loss forward+backward, D={args.dim}, tile {args.tile_size}, {args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    return rows


if __name__ == "__main__":
    main()
