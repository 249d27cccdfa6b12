"""The quality benchmarks' figure: a metric (kNN top-1 for SimCLR, mrr@10 for text) against steps, and its final
value against negatives per anchor."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: write PNG only
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.atomic_output import save_figure  # noqa: E402

COLORS = {"full": "tab:blue", "naive": "tab:orange", "gradcache": "tab:green"}
STYLES = {"full": "-", "naive": "-", "gradcache": "--"}  # dashed, so GradCache stays visible on FullBatch


def plot_quality(path: Path, rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], title: str,
                 metric: str = "knn_top1", group: str = "batch", baseline: str = "knn_top1_raw_pixels",
                 baseline_label: str = "kNN on raw pixels", label: str = "kNN top-1 (%)") -> None:
    """Left: mean `metric` over seeds against step (min-max band), one line per (strategy, `group`).
    Right: final `metric` against negatives per anchor, mean with min-max bars (the summary's `<metric>_mean`,
    `_min`, `_max`), one line per strategy. The rows' `baseline` column, where set, is drawn as a dotted line."""
    figure, (curves, finals) = plt.subplots(1, 2, figsize=(12, 4.5))
    batches = sorted({row[group] for row in rows})
    widths = {batch: 1.0 + 1.5 * index for index, batch in enumerate(batches)}  # thicker line, larger batch
    for strategy in COLORS:
        for batch in batches:
            by_step: dict[int, list[float]] = {}
            for row in rows:
                if row["strategy"] == strategy and row[group] == batch:
                    by_step.setdefault(row["step"], []).append(row[metric])
            if not by_step:
                continue
            steps = sorted(by_step)
            means = [statistics.fmean(by_step[s]) for s in steps]
            curves.plot(steps, means, STYLES[strategy], color=COLORS[strategy], linewidth=widths[batch],
                        label=f"{strategy} {group} {batch}")
            curves.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                                color=COLORS[strategy], alpha=0.12)
        points = sorted(((row["negatives_per_anchor"], row) for row in summary if row["strategy"] == strategy),
                        key=lambda point: point[0])
        if points:
            x = [negatives for negatives, _ in points]
            y = [row[f"{metric}_mean"] for _, row in points]
            errors = [[row[f"{metric}_mean"] - row[f"{metric}_min"] for _, row in points],
                      [row[f"{metric}_max"] - row[f"{metric}_mean"] for _, row in points]]
            finals.errorbar(x, y, yerr=errors, fmt="o" + STYLES[strategy], color=COLORS[strategy], capsize=3,
                            label=strategy)
            for negatives, row in points:
                finals.annotate(f"{group[0]}{row[group]}", (negatives, row[f"{metric}_mean"]), fontsize=7,
                                textcoords="offset points", xytext=(4, 4))
    raw = [float(row[baseline]) for row in rows if row.get(baseline) not in (None, "")]
    if raw:  # what the encoder must beat (kNN on raw pixels; the pretrained model before fine-tuning)
        for axis in (curves, finals):
            axis.axhline(statistics.fmean(raw), color="grey", linestyle=":", label=baseline_label)
    curves.set_xlabel("optimizer step")
    curves.set_ylabel(label)
    curves.legend(fontsize=7)
    curves.grid(True, alpha=0.3)
    finals.set_xscale("log", base=2)
    finals.set_xlabel("negatives per anchor (as the run logs them: the whole batch's, or one chunk's)")
    finals.set_ylabel(f"final {label}")
    finals.legend(fontsize=8)
    finals.grid(True, which="both", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, dpi=120)
    plt.close(figure)
