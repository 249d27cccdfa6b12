"""One run of the training program in this process (`gradcache.cli.main`), read back from the folder it wrote:
the quality benchmarks train through the program users run, never through a copy of its loop."""
from __future__ import annotations

import csv
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradcache.cli import main as gradcache_main


@dataclass
class TrainingRun:
    metrics: dict[str, Any]  # metrics.json
    evaluations: list[dict[str, str]]  # eval_log.csv, one row per evaluation in step order
    wall_s: float

    def rows(self, shared: dict[str, Any], metrics: Sequence[str]) -> list[dict[str, Any]]:
        """One row per evaluation: `shared`, its step, each of `metrics` as a float, and `final` on the last."""
        last = len(self.evaluations) - 1
        return [{**shared, "step": int(row["step"]), **{key: float(row[key]) for key in metrics},
                 "final": index == last} for index, row in enumerate(self.evaluations)]


def train(argv: list[str], folder: Path) -> TrainingRun:
    """Run `gradcache <argv>`, whose --output-dir is `folder`; a RuntimeError naming the command when it fails."""
    started = time.perf_counter()
    status = gradcache_main(argv)
    if status != 0:
        raise RuntimeError(f"gradcache {' '.join(argv)} exited with status {status}")
    wall = time.perf_counter() - started
    with open(folder / "eval_log.csv") as handle:
        evaluations = list(csv.DictReader(handle))
    return TrainingRun(json.loads((folder / "metrics.json").read_text()), evaluations, wall)
