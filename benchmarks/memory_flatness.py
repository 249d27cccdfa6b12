"""Does memory stay flat over a long run? 2,000 steps of a tiny `gradcache train simclr` run, with the resident
memory (and on CUDA `torch.cuda.max_memory_allocated`) read every 200 steps; the claim is that after 2,000 steps
each is within 5% of what it was after 200 (the first steps allocate the optimizer state, the autograd and
allocator caches; a leak grows after them).

    python -m benchmarks.memory_flatness                 # CPU, a few minutes
    python -m benchmarks.memory_flatness --device cuda

Memory is load-independent: the figures of a busy machine stand. Writes memory_flatness.csv (step, rss_mb,
cuda_max_allocated_mb) to the output folder and prints the two readings, their ratio and the load average.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from benchmarks.atomic_output import replaced
from benchmarks.flags import HelpFormatter, add_shared_options, output_folder
from gradcache.cli import main as gradcache
from gradcache.train.run_folder.log import RunLog

TINY_RUN = ["--train-size", "256", "--test-size", "32", "--image-size", "16", "--batch-size", "16", "--chunk-size",
            "8", "--width", "8", "--hidden-dim", "32", "--projection-dim", "16", "--knn-k", "5", "--warmup", "10",
            "--workers", "0", "--quiet", "--checkpoint-every", "500"]


def resident_mb() -> float:
    """This process's resident set size now (VmRSS), in MiB."""
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024  # kB


@contextlib.contextmanager
def reading_memory(every: int, device: str) -> Iterator[list[dict[str, float]]]:
    """Within the block, the training program's RunLog.log_step also records this process's memory every `every`
    steps, into the list it yields."""
    readings: list[dict[str, float]] = []
    log_step = RunLog.log_step

    def logged(self, row):
        log_step(self, row)
        if row["step"] % every == 0:
            cuda = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else float("nan")
            readings.append({"step": row["step"], "rss_mb": resident_mb(), "cuda_max_allocated_mb": cuda})

    RunLog.log_step = logged
    try:
        yield readings
    finally:
        RunLog.log_step = log_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--total-steps", type=int, default=2000, help="training steps")
    parser.add_argument("--early-step", type=int, default=200, help="the reading the last one is compared with")
    add_shared_options(parser, "memory_flatness", threads=1)
    args = parser.parse_args(argv)
    folder = output_folder(args)
    with tempfile.TemporaryDirectory() as run_folder, reading_memory(args.early_step, args.device) as readings:
        status = gradcache(["train", "simclr", *TINY_RUN, "--steps", str(args.total_steps), "--device", args.device,
                       "--threads", str(args.threads), "--output-dir", str(Path(run_folder) / "run")])
    if status:
        raise SystemExit(f"the training run failed with exit status {status}")
    with replaced(folder / f"{args.name}.csv", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(readings[0]))
        writer.writeheader()
        writer.writerows(readings)
    early = next(r for r in readings if r["step"] == args.early_step)
    late = readings[-1]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.device}; {args.total_steps} steps")
    for key in ("rss_mb", "cuda_max_allocated_mb"):
        if early[key] == early[key]:  # not NaN
            print(f"{key}: {early[key]:.1f} after step {early['step']}, {late[key]:.1f} after step {late['step']} "
                  f"({late[key] / early[key] - 1:+.2%})")
    print(f"wrote {folder / (args.name + '.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
