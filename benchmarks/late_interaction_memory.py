"""Peak memory and time of the late-interaction (ColBERT MaxSim) loss alone: one graph against tiles, N growing.

Modes: ``dense`` (``LateInteraction()``: one autograd graph over the (N, N (1 + h), Lq, Ld) token similarities)
and ``tiled`` (``LateInteraction(tile_size=..., column_tile_size=...)``: blocks of queries x documents, only (N,)
statistics kept, each block recomputed in backward). Each point runs in a fresh process (``fresh_process.py``):
the child builds unit token embeddings (queries of ``--query-length`` positions, all scored as with ColBERT's
query expansion; documents of random lengths up to ``--document-length``, masked after it; ``--hard-negatives``
per query), resets the peak-RSS mark, runs one forward + backward and reports the peak above that baseline
(CPU: VmHWM; CUDA: ``torch.cuda.max_memory_allocated``), then the median time of ``--repeats`` more. A point
whose predicted memory (the series' previous point scaled by the square of the growth of N for one graph,
linearly for tiles) exceeds ``--memory-budget-gb`` is recorded as skipped instead of run. Nothing here touches
the network.

    python -m benchmarks.late_interaction_memory                       # N = 64, 256, 1,024; tiles also at 4,096
    python -m benchmarks.late_interaction_memory --sizes 64,256 --modes dense,tiled --dim 64 --document-length 30
    python -m benchmarks.late_interaction_memory --device cuda --tiled-sizes 4096,16384
"""
from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.flags import HelpFormatter, add_shared_options, choices, output_folder
from benchmarks.fresh_process import measured_step, report, run_point
from benchmarks.report import machine_context, plot_lines, print_table, write_csv

from gradcache import TokenEmbeddings
from gradcache.losses import LateInteraction

GB = 2**30
MODES = ("dense", "tiled")
COLUMNS = ["mode", "n", "hard_negatives", "dim", "query_length", "document_length", "tile_size", "column_tile_size",
           "status", "peak_gb", "predicted_gb", "step_s", "runs", "loss_value", "process_s", "error", "device",
           "threads", "cpu_count", "loadavg_1m", "loadavg_5m", "torch_version", "gradcache_version",
           "python_version", "timestamp_utc"]
TABLE = ["mode", "n", "status", "peak_gb", "predicted_gb", "step_s", "runs", "loss_value", "loadavg_1m"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="comma-separated batch sizes N of every mode")
    parser.add_argument("--tiled-sizes", default="4096", help="comma-separated batch sizes of the tiled mode alone")
    parser.add_argument("--modes", default="dense,tiled", help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--hard-negatives", type=int, default=1, help="hard negatives per query, h")
    parser.add_argument("--dim", type=int, default=128, help="token vector width D")
    parser.add_argument("--query-length", type=int, default=32, help="query positions Lq (all scored)")
    parser.add_argument("--document-length", type=int, default=180, help="longest document Ld")
    parser.add_argument("--tile-size", type=int, default=32, help="queries per block of the tiled mode")
    parser.add_argument("--column-tile-size", type=int, default=None,
                        help="documents per block of the tiled mode (default: --tile-size)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the measured one (median)")
    parser.add_argument("--long-run-s", type=float, default=20.0,
                        help="a point whose first run takes longer reports that run's time alone")
    add_shared_options(parser, "late_interaction_memory", threads=os.cpu_count(), memory_budget_gb=12.0,
                       time_budget_s=900.0)
    return parser


def token_batch(rows: int, length: int, dim: int, generator: torch.Generator, all_scored: bool) -> TokenEmbeddings:
    """Unit token vectors; every position scored (queries) or each row masked after a random length >= 1."""
    values = F.normalize(torch.randn(rows, length, dim, generator=generator), dim=-1)
    if all_scored:
        return TokenEmbeddings(values, torch.ones(rows, length, dtype=torch.bool))
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    return TokenEmbeddings(values, torch.arange(length)[None, :] < lengths[:, None])


def make_step(point: dict[str, Any], device: torch.device) -> Callable[[], float]:
    """One forward + backward of the loss on fixed token embeddings; returns the loss value."""
    tiled = point["mode"] == "tiled"
    loss_fn = LateInteraction(tile_size=point["tile_size"] if tiled else None,
                              column_tile_size=point["column_tile_size"] if tiled else None)
    generator = torch.Generator().manual_seed(0)
    n, h, dim = point["n"], point["hard_negatives"], point["dim"]
    parts = [token_batch(n, point["query_length"], dim, generator, True),
             token_batch(n, point["document_length"], dim, generator, False)]
    if h:
        parts.append(token_batch(n * h, point["document_length"], dim, generator, False))
    inputs = [TokenEmbeddings(p.values.to(device).requires_grad_(), p.mask.to(device)) for p in parts]

    def step() -> float:
        for x in inputs:
            x.values.grad = None
        loss = loss_fn(*inputs)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return float(loss.detach())

    return step


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: one forward + backward measured for memory, then the median time of a few more."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    step = make_step(point, device)
    return {"status": "ok", **measured_step(step, device, point["memory_budget_gb"], point["repeats"],
                                            point["long_run_s"])}


def _sizes(value: str) -> list[int]:
    return [int(size) for size in value.split(",") if size]


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for mode in choices(args.modes, MODES, "--modes"):
        sizes = _sizes(args.sizes) + (_sizes(args.tiled_sizes) if mode == "tiled" else [])
        previous = None  # (n, peak_gb) of this series' last point that ran
        for n in sorted(set(sizes)):
            tiles = (args.tile_size, args.column_tile_size or args.tile_size) if mode == "tiled" else ("", "")
            row = {"mode": mode, "n": n, "hard_negatives": args.hard_negatives, "dim": args.dim,
                   "query_length": args.query_length, "document_length": args.document_length,
                   "tile_size": tiles[0], "column_tile_size": tiles[1], **machine_context(args.threads, args.device)}
            # One graph grows as N^2 (the token similarities); tiles as N (the inputs' gradients).
            if previous is not None:
                row["predicted_gb"] = previous[1] * (n / previous[0]) ** (2 if mode == "dense" else 1)
            if row.get("predicted_gb", 0.0) > args.memory_budget_gb:
                row["status"] = f"skipped: would not fit (predicted > {args.memory_budget_gb:g} GB budget)"
                rows.append(row)
                continue
            point = {"mode": mode, "n": n, "hard_negatives": args.hard_negatives, "dim": args.dim,
                     "query_length": args.query_length, "document_length": args.document_length,
                     "tile_size": args.tile_size, "column_tile_size": args.column_tile_size,
                     "threads": args.threads, "device": args.device, "repeats": args.repeats,
                     "long_run_s": args.long_run_s, "memory_budget_gb": args.memory_budget_gb}
            row.update(run_point(__spec__.name, point, args.time_budget_s))
            previous = (n, row["peak_gb"] if row.get("status") == "ok" else math.inf)
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    rows = run_sweep(args)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS)
    plot_lines(output_dir / f"{args.name}.png", rows, "n", [("peak_gb", "peak memory above baseline (GB)"),
               ("step_s", "forward + backward time (s)")], "mode",
               f"LateInteraction forward+backward, D={args.dim}, Lq={args.query_length}, Ld<={args.document_length}, "
               f"h={args.hard_negatives}, tiles {args.tile_size} x {args.column_tile_size or args.tile_size}, "
               f"{args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    return rows


if __name__ == "__main__":
    main()
