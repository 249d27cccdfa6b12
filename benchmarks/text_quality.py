"""Held-out mrr@10 of the same pretrained text encoder fine-tuned three ways at the same effective batch and
number of steps: FullBatch, GradCache (chunk c), NaiveAccumulation with small chunks (several c); several seeds.

The question of the seeds where it matters most: is accumulation a large batch for in-batch InfoNCE on text?
GradCache's gradient is FullBatch's, so their curves should coincide; accumulation's queries see only the
c (1 + h) passages of their chunk. Each run is `gradcache train text` (``gradcache.cli.main``) with the
packaged all-MiniLM-L6-v2 on the built-in `world-hard` data (the default `world` saturates at mrr@10 100, where
no strategy can beat another); its eval_log.csv and metrics.json are read back. Same data, split and seeds for
every strategy; `mrr@10_initial`, the pretrained model's, is the baseline line.

    python -m benchmarks.text_quality --steps 2 --seeds 0 --chunks 4 --train-size 64 --test-size 32   # smoke
    python -m benchmarks.text_quality --write-results      # the figure: 4 configurations x 3 seeds
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

from benchmarks.arguments import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.quality_plot import plot_quality
from benchmarks.report import machine_context, print_table, write_csv
from benchmarks.training_run import train

METRIC = "mrr@10"
COLUMNS = ["strategy", "chunk", "batch", "seed", "step", METRIC, "recall@1", "recall@10", "negatives_per_anchor",
           "final", "steps", "lr", "data", "train_size", "test_size", "max_length", "model", f"{METRIC}_initial",
           "run_wall_s", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m", "torch_version",
           "gradcache_version", "python_version", "timestamp_utc"]
SUMMARY = ["strategy", "chunk", "negatives_per_anchor", "seeds", f"{METRIC}_mean", f"{METRIC}_min", f"{METRIC}_max",
           f"{METRIC}_initial_mean", "run_wall_s_mean"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--data", default="world-hard", help="built-in world, world-hard, or a pairs file")
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="the packaged model or a local folder")
    parser.add_argument("--batch", type=int, default=8, help="effective batch (queries per step)")
    parser.add_argument("--chunks", default="1,2", help="comma-separated chunk sizes of NaiveAccumulation")
    parser.add_argument("--gradcache-chunk", type=int, default=2, help="chunk size of GradCache")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of every run")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (initialisation, data order)")
    parser.add_argument("--train-size", type=int, default=None, help="training rows (default: batch x steps)")
    parser.add_argument("--test-size", type=int, default=100, help="held-out rows (queries)")
    parser.add_argument("--max-length", type=int, default=40, help="tokens per text (world-hard: 33 on average, 37 at most)")
    parser.add_argument("--lr", type=float, default=2e-4,
                        help="peak learning rate at the trainer's base batch 32 (sqrt-scaled to --batch)")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: at start and end)")
    parser.add_argument("--runs-dir", default=None, help="keep the run folders here (default: a temp folder)")
    add_shared_options(parser, "text_quality", threads=1,
                       threads_help="torch threads of each training run (0: the trainer's default; 1 stays fast "
                                    "on a loaded machine, where two threads wait on each other)")
    return parser


def configurations(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(strategy, chunk): FullBatch (one chunk: the batch), GradCache, and Naive at every --chunks."""
    return [("full", args.batch), ("gradcache", args.gradcache_chunk),
            *(("naive", chunk) for chunk in integer_list(args.chunks, "--chunks"))]


def train_one(args: argparse.Namespace, strategy: str, chunk: int, seed: int, runs: Path) -> list[dict[str, Any]]:
    """One `gradcache train text` run -> one row per evaluation, the last marked final."""
    folder = runs / f"{strategy}-c{chunk}-s{seed}"
    train_size = args.train_size or args.batch * args.steps
    argv = ["train", "text", "--data", args.data, "--model", args.model, "--strategy", strategy, "--batch-size",
            str(args.batch), "--chunk-size", str(chunk), "--steps", str(args.steps), "--seed", str(seed),
            "--train-size", str(train_size), "--test-size", str(args.test_size), "--max-length",
            str(args.max_length), "--eval-every", str(args.eval_every), "--device", args.device, "--output-dir",
            str(folder), "--checkpoint-every", str(args.steps), "--quiet"]
    argv += ["--lr", str(args.lr)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    run = train(argv, folder)
    metrics = run.metrics
    shared = {"strategy": strategy, "chunk": chunk, "batch": args.batch, "seed": seed, "steps": args.steps, "lr": args.lr,
              "negatives_per_anchor": metrics["negatives_per_anchor"], "data": args.data, "train_size": train_size,
              "test_size": args.test_size, "max_length": args.max_length, "model": args.model,
              f"{METRIC}_initial": metrics[f"{METRIC}_initial"], "run_wall_s": round(run.wall_s, 1),
              **machine_context(torch.get_num_threads(), args.device)}
    return run.rows(shared, (METRIC, "recall@1", "recall@10"))


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Final mrr@10 over seeds per (strategy, chunk): mean, min, max; the pretrained model's mean beside it."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["final"]:
            groups.setdefault((row["strategy"], row["chunk"]), []).append(row)
    return [{"strategy": strategy, "chunk": chunk, "negatives_per_anchor": group[0]["negatives_per_anchor"],
             "seeds": len(group), f"{METRIC}_mean": statistics.fmean(r[METRIC] for r in group),
             f"{METRIC}_min": min(r[METRIC] for r in group), f"{METRIC}_max": max(r[METRIC] for r in group),
             f"{METRIC}_initial_mean": statistics.fmean(r[f"{METRIC}_initial"] for r in group),
             "run_wall_s_mean": statistics.fmean(r["run_wall_s"] for r in group)}
            for (strategy, chunk), group in groups.items()]



def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    seeds = integer_list(args.seeds, "--seeds")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        runs = Path(args.runs_dir or scratch)
        for seed in seeds:
            for strategy, chunk in configurations(args):
                rows += train_one(args, strategy, chunk, seed, runs)
                print(json.dumps({k: rows[-1][k] for k in ("strategy", "chunk", "seed", METRIC, f"{METRIC}_initial",
                                                           "run_wall_s", "loadavg_1m")}), flush=True)
    output = output_folder(args)
    write_csv(output / f"{args.name}.csv", rows, COLUMNS)
    summary = summarise(rows)
    write_csv(output / f"{args.name}_summary.csv", summary, SUMMARY)
    plot_quality(output / f"{args.name}.png", rows, summary, f"text: {args.model} on {args.data}, batch "
                 f"{args.batch}, {args.steps} steps, seeds {args.seeds}, max length {args.max_length}, {args.device}",
                 metric=METRIC, group="chunk", baseline=f"{METRIC}_initial", baseline_label="pretrained (step 0)",
                 label="held-out mrr@10 (%)")
    print_table(summary, SUMMARY)
    print(f"total wall time {time.perf_counter() - started:.0f} s; wrote {output / args.name}.csv, "
          f"_summary.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
