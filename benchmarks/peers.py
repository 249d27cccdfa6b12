"""Side by side with peers, each point in a fresh process: (a) sentence-transformers'
CachedMultipleNegativesRankingLoss against our GradCache and CachedLoss with InfoNCE on one text encoder,
same batch and mini-batch (step time, peak memory); (b) open_clip's ClipLoss against our ClipLoss, dense
and tiled (loss forward and backward alone: peak memory and time at growing N).

The same randomly initialised `models.TextEncoder` is used by every side (a thin wrapper gives it the
`features -> {"sentence_embedding": ...}` interface sentence-transformers calls); scale 20 is InfoNCE's
temperature 0.05, both on cosine similarity. Peers are the optional extra `pip install -e ".[peers]"`;
without them their points are recorded as skipped and the rest runs.

    python -m benchmarks.peers                               # CPU, a few minutes
    python -m benchmarks.peers --device cuda --batch 4096 --mini-batch 256 --max-pairs 65536
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.fresh_process import PeakMemory, median_time, report, run_point
from benchmarks.peer_steps import CLIP_SIDES, TEXT_SIDES, build_step
from benchmarks.flags import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, plot_lines, print_table, write_csv

MB = 2**20
PEER_PACKAGES = {"st_cached_mnrl": "sentence-transformers", "open_clip": "open-clip-torch"}
COLUMNS = ["comparison", "side", "batch", "mini_batch", "status", "peak_mb", "step_s", "peer_version", "steps",
           "process_s", "error", "device", "threads", "cpu_count", "loadavg_1m", "loadavg_5m", "torch_version",
           "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["comparison", "side", "batch", "mini_batch", "status", "peak_mb", "step_s", "peer_version"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--batch", type=int, default=256, help="(a) pairs per step")
    parser.add_argument("--mini-batch", type=int, default=32, help="(a) chunk / mini_batch_size of every side")
    parser.add_argument("--text-length", type=int, default=32, help="(a) tokens per text")
    parser.add_argument("--text-width", type=int, default=128, help="(a) text encoder width")
    parser.add_argument("--text-layers", type=int, default=2, help="(a) text encoder layers")
    parser.add_argument("--min-pairs", type=int, default=1024, help="(b) first N of the doubling loss sweep")
    parser.add_argument("--max-pairs", type=int, default=8192, help="(b) last N of the doubling loss sweep")
    parser.add_argument("--embed-dim", type=int, default=128, help="(b) embedding size D")
    parser.add_argument("--tile-size", type=int, default=256, help="(b) rows per tile of our tiled ClipLoss")
    add_shared_options(parser, "peers", timed_steps=3, memory_budget_gb=6.0, time_budget_s=300.0)
    return parser


def peer_version(side: str) -> str | None:
    """Installed version of the peer package a side needs; '' for our own sides; None when not installed."""
    if side not in PEER_PACKAGES:
        return ""
    try:
        return importlib.metadata.version(PEER_PACKAGES[side])
    except importlib.metadata.PackageNotFoundError:
        return None


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    if point["threads"]:  # 0 keeps torch's default (an in-process caller such as a test)
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    build_step({**point, "batch": 4, "mini_batch": 2}, device)()  # load kernels before the baseline
    budget = int(point["memory_budget_gb"] * 2**30) if point["memory_budget_gb"] else None
    memory = PeakMemory(device, budget)
    step = build_step(point, device)
    step_s, _ = median_time(step, point["steps"], point["warmup"], device)
    peak_mb = memory.peak_above_baseline() / MB
    memory.stop()
    return {"status": "ok", "peak_mb": peak_mb, "step_s": step_s}


def sweep(args: argparse.Namespace, module: str) -> list[dict[str, Any]]:
    shared = {key: getattr(args, key) for key in ("text_length", "text_width", "text_layers", "embed_dim",
                                                  "tile_size", "steps", "warmup", "threads", "device",
                                                  "memory_budget_gb")}
    points = [{"comparison": "cached_text_step", "side": side, "batch": args.batch, "mini_batch": args.mini_batch}
              for side in TEXT_SIDES]
    pairs = args.min_pairs
    while pairs <= args.max_pairs:
        points += [{"comparison": "clip_loss", "side": side, "batch": pairs, "mini_batch": ""} for side in CLIP_SIDES]
        pairs *= 2
    rows, over_budget = [], set()
    for point in points:
        version = peer_version(point["side"])
        if version is None:
            result = {"status": f"skipped ({PEER_PACKAGES[point['side']]} not installed)"}
        elif point["side"] in over_budget:
            result = {"status": "skipped (over budget at a smaller N)"}
        else:
            result = run_point(module, {**shared, **point}, args.time_budget_s)
            if result["status"] in ("oom", "over_memory_budget", "over_time_budget"):
                over_budget.add(point["side"])
        row = {**point, **machine_context(args.threads, args.device), **result, "peer_version": version or "",
               "steps": args.steps}
        print(json.dumps({key: row.get(key) for key in TABLE}), flush=True)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.point:
        report(measure_point(json.loads(args.point)))
        return 0
    rows = sweep(args, __spec__.name)
    output = output_folder(args)
    write_csv(output / f"{args.name}.csv", rows, COLUMNS)
    clip = [row for row in rows if row["comparison"] == "clip_loss" and row["status"] == "ok"]
    if clip:  # none when the sweep was limited to the text comparison (--max-pairs below --min-pairs)
        plot_lines(output / f"{args.name}_clip_loss.png", clip, "batch",
                   [("peak_mb", "peak memory above baseline (MiB)"), ("step_s", "forward + backward (s, median)")],
                   "side", f"CLIP loss alone, D={args.embed_dim}, {args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    skipped = sorted({row["side"] for row in rows if str(row["status"]).startswith("skipped (")})
    if skipped:
        print(f"skipped comparisons: {', '.join(skipped)} (see the status column)")
    print(f"wrote {output / args.name}.csv and {args.name}_clip_loss.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
