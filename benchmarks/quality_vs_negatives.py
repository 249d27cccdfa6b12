"""kNN top-1 of the same SimCLR encoder trained three ways at the same effective batch and number of steps:
FullBatch (where it fits), NaiveAccumulation with chunk c, GradCache with chunk c; several batches and seeds.

It answers whether plain accumulation is a large batch for an in-batch contrastive loss. GradCache's gradient
is FullBatch's, so their curves should coincide; accumulation's anchors see only 2c - 2 negatives. The
encoder is the GroupNorm ConvNet: BatchNorm's per-chunk statistics would confound the comparison. Each run is
`gradcache train simclr` (``gradcache.cli.main``) on the built-in shapes data; its eval_log.csv is read back.

    python -m benchmarks.quality_vs_negatives                   # smoke size, a few minutes on CPU
    python -m benchmarks.quality_vs_negatives --batches 64,256 --steps 150 --seeds 0,1,2 --eval-every 25
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.quality_plot import plot_quality
from benchmarks.arguments import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.report import machine_context, print_table, write_csv
from benchmarks.training_run import train

STRATEGIES = ("full", "naive", "gradcache")  # the training program's names for FullBatch, Naive, GradCache
COLUMNS = ["strategy", "batch", "chunk", "seed", "step", "knn_top1", "negatives_per_anchor", "final", "steps",
           "train_size", "test_size", "width", "image_size", "lr", "run_wall_s", "peak_memory_mb",
           "knn_top1_random_init", "knn_top1_raw_pixels", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m",
           "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
SUMMARY = ["strategy", "batch", "negatives_per_anchor", "seeds", "knn_top1_mean", "knn_top1_min", "knn_top1_max",
           "run_wall_s_mean"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--batches", default="32,64", help="comma-separated effective batch sizes")
    parser.add_argument("--chunk", type=int, default=16, help="chunk size c of Naive and GradCache")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of every run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (initialisation, data order)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    parser.add_argument("--full-batch-max", type=int, default=1024, help="FullBatch only up to this batch")
    parser.add_argument("--train-size", type=int, default=256, help="built-in shapes: training images")
    parser.add_argument("--test-size", type=int, default=128, help="built-in shapes: held-out images for kNN")
    parser.add_argument("--width", type=int, default=16, help="ConvNet width (GroupNorm)")
    parser.add_argument("--image-size", type=int, default=32, help="side of the rendered shapes")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the trainer's)")
    parser.add_argument("--eval-every", type=int, default=0, help="kNN every N steps (0: at start and end)")
    parser.add_argument("--knn-k", type=int, default=20, help="kNN neighbours")
    parser.add_argument("--runs-dir", default=None, help="keep the run folders here (default: a temp folder)")
    add_shared_options(parser, "quality_vs_negatives", threads=0,
                       threads_help="torch threads of each training run (0: the trainer's default, CPU cores minus "
                                    "its one data worker)")
    return parser


def train_one(args: argparse.Namespace, strategy: str, batch: int, seed: int, runs: Path) -> list[dict[str, Any]]:
    """One `gradcache train simclr` run -> one row per evaluation, the last marked final."""
    chunk = min(args.chunk, batch)
    folder = runs / f"{strategy}-b{batch}-c{chunk}-s{seed}"
    argv = ["train", "simclr", "--data", "shapes", "--model", "convnet", "--norm", "group", "--width",
            str(args.width), "--strategy", strategy, "--batch-size", str(batch), "--chunk-size", str(chunk),
            "--steps", str(args.steps), "--seed", str(seed), "--image-size", str(args.image_size), "--train-size",
            str(args.train_size), "--test-size", str(args.test_size), "--eval-every", str(args.eval_every), "--knn-k",
            str(args.knn_k), "--device", args.device, "--output-dir", str(folder), "--checkpoint-every",
            str(args.steps), "--quiet"]
    if args.lr is not None:
        argv += ["--lr", str(args.lr)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    run = train(argv, folder)
    metrics = run.metrics
    shared = {"strategy": strategy, "batch": batch, "chunk": chunk, "seed": seed, "steps": args.steps,
              "negatives_per_anchor": metrics["negatives_per_anchor"], "train_size": args.train_size, "test_size": args.test_size,
              "width": args.width, "image_size": args.image_size, "lr": args.lr if args.lr is not None else "default",
              "run_wall_s": round(run.wall_s, 1),
              **{key: metrics.get(key) for key in ("peak_memory_mb", "knn_top1_random_init", "knn_top1_raw_pixels")},
              **machine_context(torch.get_num_threads(), args.device)}  # as the run set them
    return run.rows(shared, ("knn_top1",))


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Final kNN top-1 over seeds per (strategy, batch): mean, min, max."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["final"]:
            groups.setdefault((row["strategy"], row["batch"]), []).append(row)
    return [{"strategy": strategy, "batch": batch, "negatives_per_anchor": group[0]["negatives_per_anchor"],
             "seeds": len(group), "knn_top1_mean": statistics.fmean(r["knn_top1"] for r in group),
             "knn_top1_min": min(r["knn_top1"] for r in group), "knn_top1_max": max(r["knn_top1"] for r in group),
             "run_wall_s_mean": statistics.fmean(r["run_wall_s"] for r in group)}
            for (strategy, batch), group in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0]))]



def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    batches, seeds = integer_list(args.batches, "--batches"), integer_list(args.seeds, "--seeds")
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    if set(strategies) - set(STRATEGIES):
        raise ValueError(f"--strategies={args.strategies!r}; choose from {list(STRATEGIES)}.")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        runs = Path(args.runs_dir or scratch)
        for batch in batches:
            for seed in seeds:
                for strategy in strategies:
                    if strategy == "full" and batch > args.full_batch_max:
                        print(f"skipped FullBatch at batch {batch} (> --full-batch-max {args.full_batch_max})")
                        continue
                    rows += train_one(args, strategy, batch, seed, runs)
                    print(json.dumps({k: rows[-1][k] for k in ("strategy", "batch", "seed", "knn_top1",
                                                               "run_wall_s")}), flush=True)
    output = output_folder(args)
    write_csv(output / f"{args.name}.csv", rows, COLUMNS)
    summary = summarise(rows)
    write_csv(output / f"{args.name}_summary.csv", summary, SUMMARY)
    plot_quality(output / f"{args.name}.png", rows, summary, f"SimCLR, GroupNorm ConvNet width {args.width}, "
                 f"chunk {args.chunk}, {args.steps} steps, seeds {args.seeds}, {args.device}")
    print_table(summary, SUMMARY)
    print(f"total wall time {time.perf_counter() - started:.0f} s; wrote {output / args.name}.csv, "
          f"_summary.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
