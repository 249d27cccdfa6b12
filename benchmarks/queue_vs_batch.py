"""For one memory, which buys more quality: a larger GradCache batch, a queue of past embeddings, or both?

At one chunk size c (the encoder's activation memory, which sets peak memory) and the same examples seen (same
epochs), four ways to train the same model on the built-in shapes data of `gradcache train simclr` and `clip`:

    gradcache_large   GradCache at the large batch B                     in-batch negatives of B
    gradcache_queue   GradCache at the small batch b, queue Q            in-batch of b + Q queued
    naive_queue       accumulation at B in micro-batches of c, queue Q   in-batch of c + Q (advanced per micro-batch)
    naive             accumulation at B in micro-batches of c            in-batch of c

Q defaults to what brings b up to B's negatives per anchor. Each run is `gradcache train <mode>` in a fresh process
(``fresh_process.run_point``), so its peak memory (RSS on CPU, above the child's baseline after imports) is its own.
Quality: kNN top-1 of the SimCLR encoder, zero-shot top-1 of CLIP on the held-out images. Negatives per anchor are
the trainer's own figure (metrics.json: in-batch plus the queue as the run ended).

    python -m benchmarks.queue_vs_batch                     # the committed figures: both modes, 3 seeds
    python -m benchmarks.queue_vs_batch --modes simclr --seeds 0 --epochs 1   # a smoke run
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

import matplotlib

matplotlib.use("Agg")  # headless: write PNG only
import matplotlib.pyplot as plt  # noqa: E402

from gradcache import negatives_per_anchor  # noqa: E402
from benchmarks.atomic_output import save_figure  # noqa: E402
from benchmarks.fresh_process import PeakMemory, report, run_point  # noqa: E402
from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder  # noqa: E402
from benchmarks.report import machine_context, print_table, write_csv  # noqa: E402

CONFIGS = ("gradcache_large", "gradcache_queue", "naive_queue", "naive")
QUALITY = {"simclr": "knn_top1", "clip": "zero_shot_top1"}  # the metric each mode is read by
LOSS_KIND = {"simclr": "ntxent", "clip": "clip"}
MODE_OPTIONS = {  # small models: the whole experiment fits in minutes on 2 shared CPU cores
    "simclr": ["--width", "8", "--hidden-dim", "64", "--projection-dim", "32", "--knn-k", "20"],
    "clip": ["--width", "8", "--projection-dim", "32", "--text-width", "32", "--text-layers", "1",
             "--text-heads", "2", "--context-length", "32"],
}
COLUMNS = ["mode", "config", "seed", "strategy", "batch", "chunk", "queue_size", "steps", "quality_metric",
           "quality", "quality_initial", "negatives_per_anchor", "peak_memory_mb", "run_wall_s", "train_size",
           "test_size", "image_size", "lr", "status", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m",
           "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
SUMMARY = ["mode", "config", "batch", "queue_size", "negatives_per_anchor", "seeds", "quality_mean", "quality_min",
           "quality_max", "peak_memory_mb_mean", "run_wall_s_mean"]
COLORS = {"gradcache_large": "tab:green", "gradcache_queue": "tab:purple", "naive_queue": "tab:red",
          "naive": "tab:orange"}


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--modes", default="simclr,clip", help="comma-separated: simclr, clip")
    parser.add_argument("--large-batch", type=int, default=32, help="B: GradCache's large batch, accumulation's batch")
    parser.add_argument("--small-batch", type=int, default=8, help="b: GradCache's batch beside the queue")
    parser.add_argument("--chunk", type=int, default=8, help="c: the chunk (micro-batch) of every run")
    parser.add_argument("--queue-size", type=int, default=None,
                        help="Q (default: B's negatives per anchor minus b's, so b + Q matches B)")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the training data (same for all)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--train-size", type=int, default=256, help="built-in shapes: training images")
    parser.add_argument("--test-size", type=int, default=128, help="built-in shapes: held-out images")
    parser.add_argument("--image-size", type=int, default=16, help="side of the rendered shapes")
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate at --large-batch (sqrt scaling)")
    parser.add_argument("--time-budget-s", type=float, default=600, help="a run longer than this is recorded as such")
    add_shared_options(parser, "queue_vs_batch", threads=2,
                       threads_help="torch threads of each training run")
    parser.add_argument("--point", default=None, help=argparse.SUPPRESS)  # internal: one run, in a fresh process
    return parser


def plan(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    """The four configurations of one mode: strategy, batch, queue and steps (same examples seen)."""
    kind = LOSS_KIND[mode]
    queue = args.queue_size
    if queue is None:
        queue = (negatives_per_anchor("gradcache", kind, args.large_batch, args.chunk)
                 - negatives_per_anchor("gradcache", kind, args.small_batch, args.chunk))
    large_steps = args.epochs * (args.train_size // args.large_batch)
    small_steps = args.epochs * (args.train_size // args.small_batch)
    return [dict(config="gradcache_large", strategy="gradcache", batch=args.large_batch, queue_size=0,
                 steps=large_steps),
            dict(config="gradcache_queue", strategy="gradcache", batch=args.small_batch, queue_size=queue,
                 steps=small_steps),
            dict(config="naive_queue", strategy="naive", batch=args.large_batch, queue_size=queue, steps=large_steps),
            dict(config="naive", strategy="naive", batch=args.large_batch, queue_size=0, steps=large_steps)]


def run_one(point: dict[str, Any]) -> dict[str, Any]:
    """In the child: one `gradcache train` run; its final quality, negatives and peak memory."""
    from gradcache.cli import main as gradcache_main

    folder = Path(point["folder"])
    argv = ["train", point["mode"], "--data", "shapes", "--model", "convnet", "--norm", "group",
            "--strategy", point["strategy"], "--batch-size", str(point["batch"]), "--chunk-size", str(point["chunk"]),
            "--queue-size", str(point["queue_size"]), "--steps", str(point["steps"]), "--seed", str(point["seed"]),
            "--image-size", str(point["image_size"]), "--train-size", str(point["train_size"]), "--test-size",
            str(point["test_size"]), "--lr", str(point["lr"]), "--base-batch-size", str(point["base_batch"]),
            "--warmup", "2", "--workers", "0", "--threads", str(point["threads"]), "--device", point["device"],
            "--output-dir", str(folder), "--checkpoint-every", str(point["steps"]), "--quiet",
            *MODE_OPTIONS[point["mode"]]]
    import torch

    memory = PeakMemory(torch.device(point["device"]), None)
    started = time.perf_counter()
    status = gradcache_main(argv)
    wall = time.perf_counter() - started
    peak = memory.peak_above_baseline()
    if status != 0:
        return {"status": f"exit {status}"}
    metrics = json.loads((folder / "metrics.json").read_text())
    metric = QUALITY[point["mode"]]
    return {"status": "ok", "quality": metrics[metric], "quality_initial": metrics.get("step0", {}).get(metric),
            "negatives_per_anchor": metrics["negatives_per_anchor"], "peak_memory_mb": round(peak / 2**20, 1),
            "run_wall_s": round(wall, 1)}


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Final quality over seeds per (mode, config): mean, min, max."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "ok":
            groups.setdefault((row["mode"], row["config"]), []).append(row)
    return [{"mode": mode, "config": config, "batch": group[0]["batch"], "queue_size": group[0]["queue_size"],
             "negatives_per_anchor": group[0]["negatives_per_anchor"], "seeds": len(group),
             "quality_mean": statistics.fmean(r["quality"] for r in group),
             "quality_min": min(r["quality"] for r in group), "quality_max": max(r["quality"] for r in group),
             "peak_memory_mb_mean": statistics.fmean(r["peak_memory_mb"] for r in group),
             "run_wall_s_mean": statistics.fmean(r["run_wall_s"] for r in group)}
            for (mode, config), group in groups.items()]


def plot(path: Path, rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], title: str) -> None:
    """One row per mode: final quality against negatives per anchor (left) and against peak memory (right),
    each seed a small dot, the mean over seeds a large one."""
    modes = sorted({row["mode"] for row in summary})
    figure, axes = plt.subplots(len(modes), 2, figsize=(11, 4 * len(modes)), squeeze=False)
    for (by_negatives, by_memory), mode in zip(axes, modes):
        for config in CONFIGS:
            seeds = [r for r in rows if r["mode"] == mode and r["config"] == config and r["status"] == "ok"]
            means = [s for s in summary if s["mode"] == mode and s["config"] == config]
            for axis, x, mean_x in ((by_negatives, "negatives_per_anchor", "negatives_per_anchor"),
                                    (by_memory, "peak_memory_mb", "peak_memory_mb_mean")):
                axis.scatter([r[x] for r in seeds], [r["quality"] for r in seeds], s=12, alpha=0.5,
                             color=COLORS[config])
                axis.scatter([s[mean_x] for s in means], [s["quality_mean"] for s in means], s=70,
                             color=COLORS[config], label=config, edgecolors="black")
        initial = [r["quality_initial"] for r in rows if r["mode"] == mode and r.get("quality_initial") is not None]
        for axis, label in ((by_negatives, "negatives per anchor (with a full queue)"),
                            (by_memory, "peak memory above baseline (MB)")):
            if initial:
                axis.axhline(statistics.fmean(initial), color="grey", linestyle=":", label="at step 0")
            axis.set_xlabel(label)
            axis.set_ylabel(f"{mode}: final {QUALITY[mode]} (%)")
            axis.grid(True, alpha=0.3)
        by_negatives.set_xscale("log", base=2)
        by_negatives.legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, dpi=120)
    plt.close(figure)



def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one(json.loads(args.point)))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(QUALITY):
        raise ValueError(f"--modes={args.modes!r}; choose from {sorted(QUALITY)}.")
    seeds = integer_list(args.seeds, "--seeds")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    context = machine_context(args.threads, args.device)
    with tempfile.TemporaryDirectory() as runs:
        for mode in modes:
            for seed in seeds:
                for config in plan(args, mode):
                    point = {**config, "mode": mode, "seed": seed, "chunk": args.chunk, "image_size": args.image_size,
                             "train_size": args.train_size, "test_size": args.test_size, "lr": args.lr,
                             "base_batch": args.large_batch, "threads": args.threads, "device": args.device,
                             "folder": str(Path(runs) / f"{mode}-{config['config']}-s{seed}")}
                    result = run_point("benchmarks.queue_vs_batch", point, args.time_budget_s)
                    rows.append({**point, "quality_metric": QUALITY[mode], **context, **result})
                    print(json.dumps({k: rows[-1].get(k) for k in ("mode", "config", "seed", "quality",
                                                                  "negatives_per_anchor", "peak_memory_mb",
                                                                  "run_wall_s", "status")}), flush=True)
    output = output_folder(args)
    write_csv(output / f"{args.name}.csv", rows, COLUMNS)
    summary = summarise(rows)
    write_csv(output / f"{args.name}_summary.csv", summary, SUMMARY)
    plot(output / f"{args.name}.png", rows, summary,
         f"chunk {args.chunk}, B {args.large_batch}, b {args.small_batch}, {args.epochs} epoch(s) of "
         f"{args.train_size} shapes at {args.image_size}px, convnet width 8, seeds {args.seeds}, {args.device}")
    print_table(summary, SUMMARY)
    print(f"total wall time {time.perf_counter() - started:.0f} s; load average {context.get('loadavg_1m')}; "
          f"wrote {output / args.name}.csv, _summary.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
