"""The quality benchmark's figure: kNN top-1 against steps, and final kNN top-1 against negatives per anchor."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: write PNG only
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"full": "tab:blue", "naive": "tab:orange", "gradcache": "tab:green"}
STYLES = {"full": "-", "naive": "-", "gradcache": "--"}  # dashed, so GradCache stays visible on FullBatch


def plot_quality(path: Path, rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], title: str) -> None:
    """Left: mean kNN top-1 over seeds against step (min-max band), one line per (strategy, batch).
    Right: final kNN top-1 against negatives per anchor, mean with min-max bars, one line per strategy."""
    figure, (curves, finals) = plt.subplots(1, 2, figsize=(12, 4.5))
    batches = sorted({row["batch"] for row in rows})
    widths = {batch: 1.0 + 1.5 * index for index, batch in enumerate(batches)}  # thicker line, larger batch
    for strategy in COLORS:
        for batch in batches:
            by_step: dict[int, list[float]] = {}
            for row in rows:
                if row["strategy"] == strategy and row["batch"] == batch:
                    by_step.setdefault(row["step"], []).append(row["knn_top1"])
            if not by_step:
                continue
            steps = sorted(by_step)
            means = [statistics.fmean(by_step[s]) for s in steps]
            curves.plot(steps, means, STYLES[strategy], color=COLORS[strategy], linewidth=widths[batch],
                        label=f"{strategy} batch {batch}")
            curves.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                                color=COLORS[strategy], alpha=0.12)
        points = sorted(((row["negatives_per_anchor"], row) for row in summary if row["strategy"] == strategy),
                        key=lambda point: point[0])
        if points:
            x = [negatives for negatives, _ in points]
            y = [row["knn_top1_mean"] for _, row in points]
            errors = [[row["knn_top1_mean"] - row["knn_top1_min"] for _, row in points],
                      [row["knn_top1_max"] - row["knn_top1_mean"] for _, row in points]]
            finals.errorbar(x, y, yerr=errors, fmt="o" + STYLES[strategy], color=COLORS[strategy], capsize=3,
                            label=strategy)
            for negatives, row in points:
                finals.annotate(f"b{row['batch']}", (negatives, row["knn_top1_mean"]), fontsize=7,
                                textcoords="offset points", xytext=(4, 4))
    raw = [float(row["knn_top1_raw_pixels"]) for row in rows if row.get("knn_top1_raw_pixels") not in (None, "")]
    if raw:  # what kNN on the pixels themselves reaches: a learned encoder should end above it
        for axis in (curves, finals):
            axis.axhline(statistics.fmean(raw), color="grey", linestyle=":", label="kNN on raw pixels")
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("kNN top-1 (%)")
    curves.legend(fontsize=7)
    curves.grid(True, alpha=0.3)
    finals.set_xscale("log", base=2)
    finals.set_xlabel("negatives per anchor (effective batch 2N - 2; accumulation 2c - 2)")
    finals.set_ylabel("final kNN top-1 (%)")
    finals.legend(fontsize=8)
    finals.grid(True, which="both", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
