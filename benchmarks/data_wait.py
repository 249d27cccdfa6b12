"""Is the data loader the bottleneck? The share of step time `gradcache train` waits for its batches, on webdataset
shards at 64 px, with 0 and 2 loader workers: a real run of `--steps` steps per setting (a convnet image tower and
the default text tower), read back from its own logs: `data_wait_share` of RUN/metrics.json (every step) and, from
RUN/train_log.csv without step 1 (which also waits for the workers to start), the wait over the step time, the
median `data_wait_s` and the median step seconds (the global batch over `samples_per_s`, the wait included).

    python -m benchmarks.data_wait                                   # clip, 8,000 samples, workers 0 and 2, 3 rounds
    python -m benchmarks.data_wait --parts clip-shards,simclr-shards --rounds 5

Round robin: each round runs every (part, workers) setting once, a fresh run each, in an order rotated by the
round, so a change of the machine's load falls on all settings alike; the medians over rounds are printed.
The shards (`benchmarks.image_data`) and runs go to `--data-dir`; each run folder is removed once read. Writes
data_wait.csv (one row per run) and data_wait_summary.csv (medians per setting) to the output folder. Time
depends on the machine's load: report figures of an idle machine only.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import image_data
from benchmarks.first_step import CHECKOUT
from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.image_data_scaling import add_data_options
from benchmarks.report import write_csv

PARTS = ("clip-shards", "simclr-shards")
MODEL = {"clip": ["--model", "convnet"],  # the text tower at its defaults
         "simclr": ["--model", "convnet", "--eval-reference-size", "512"]}
FIGURES = ["data_wait_share", "wait_share_after_step1", "median_data_wait_s", "median_step_s"]
COLUMNS = ["part", "workers", "round", "steps", "batch_size", *FIGURES, "train_wall_s"]


def run_argv(part: str, data: Path, run_folder: Path, workers: int, args: argparse.Namespace) -> list[str]:
    mode = part.split("-")[0]
    return ["train", mode, "--data", str(Path(data).resolve()), "--output-dir", str(Path(run_folder).resolve()),
            "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--chunk-size", str(args.chunk_size), "--steps", str(args.steps), "--warmup", "1",
            "--test-size", str(args.test_size), "--workers", str(workers), "--threads", str(args.threads),
            "--device", args.device, "--checkpoint-every", "100000", "--quiet", *MODEL[mode]]


def read_run(run_folder: Path) -> dict[str, Any]:
    """The wait figures of a finished run folder (see the module's docstring)."""
    metrics = json.loads((run_folder / "metrics.json").read_text())
    with open(run_folder / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    after_first = [row for row in rows if int(row["step"]) > 1]
    if not after_first:
        raise ValueError(f"{run_folder} logged {len(rows)} step(s); the wait after step 1 needs --steps 2 or more")
    batch = metrics["batch_size"]
    waits = [float(row["data_wait_s"]) for row in after_first]
    steps = [batch / float(row["samples_per_s"]) for row in after_first]  # seconds of each step, its wait included
    return {"steps": len(rows), "data_wait_share": metrics["data_wait_share"],
            "wait_share_after_step1": round(sum(waits) / sum(steps), 4),
            "median_data_wait_s": round(statistics.median(waits), 4),
            "median_step_s": round(statistics.median(steps), 4)}


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (part, workers): the median over rounds of each figure."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["part"], run["workers"]), []).append(run)
    return [{"part": part, "workers": workers, "rounds": len(mine),
             **{figure: round(statistics.median(run[figure] for run in mine), 4) for figure in FIGURES}}
            for (part, workers), mine in grouped.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--parts", default="clip-shards", help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--workers", default="0,2", help="comma-separated loader worker counts, each a setting")
    parser.add_argument("--size", type=int, default=8000, help="samples in the generated shards")
    parser.add_argument("--steps", type=int, default=20, help="steps of each run (at least 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the round robin (a fresh run each)")
    parser.add_argument("--batch-size", type=int, default=256, help="--batch-size of the runs")
    parser.add_argument("--chunk-size", type=int, default=64, help="--chunk-size of the runs")
    parser.add_argument("--time-budget-s", type=float, default=1800.0, help="a run longer than this fails")
    add_data_options(parser, workers=None)
    add_shared_options(parser, "data_wait", threads_help="--threads of the runs")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if sorted(set(parts) - set(PARTS)):
        parser.error(f"--parts {args.parts!r}: unknown {sorted(set(parts) - set(PARTS))}; choose from "
                     f"{', '.join(PARTS)}")
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: the wait is read after step 1; give 2 or more (default 20)")
    folder = output_folder(args)
    data = image_data.shards(Path(args.data_dir), args.size, args.image_size, args.shard_size)
    settings = [(part, workers) for part in parts for workers in integer_list(args.workers, "--workers")]
    runs = []
    for index in range(args.rounds):
        shift = index % len(settings)
        for part, workers in settings[shift:] + settings[:shift]:
            run_folder = Path(args.data_dir) / "runs" / f"data_wait-{part}-{workers}"
            shutil.rmtree(run_folder, ignore_errors=True)
            command = [sys.executable, "-m", "gradcache", *run_argv(part, data, run_folder, workers, args)]
            done = subprocess.run(command, capture_output=True, text=True, cwd=CHECKOUT, timeout=args.time_budget_s)
            if done.returncode != 0:
                tail = " | ".join(done.stderr.strip().splitlines()[-5:])
                raise RuntimeError(f"{part} with --workers {workers} exited {done.returncode}: {tail}")
            figures = read_run(run_folder)
            wall = json.loads((run_folder / "metrics.json").read_text())["wall_time_s"]
            shutil.rmtree(run_folder, ignore_errors=True)
            runs.append({"part": part, "workers": workers, "round": index + 1, "batch_size": args.batch_size,
                         **figures, "train_wall_s": wall})
            print(json.dumps(runs[-1]), flush=True)
    medians = summary(runs)
    write_csv(folder / f"{args.name}.csv", runs, COLUMNS)
    write_csv(folder / f"{args.name}_summary.csv", medians, list(medians[0]))
    for row in medians:
        print(f"{row['part']} --workers {row['workers']}: data_wait_share {row['data_wait_share']:.2%}, "
              f"after step 1 {row['wait_share_after_step1']:.2%}, median wait {row['median_data_wait_s']:.3f} s "
              f"of a {row['median_step_s']:.3f} s step (medians of {row['rounds']} rounds)")
    print(f"wrote {folder / (args.name + '.csv')} and {args.name}_summary.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
