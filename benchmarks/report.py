"""Write a benchmark's rows: CSV with the machine's context, a printed table, and log-log line plots (Agg)."""
from __future__ import annotations

import csv
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: benchmarks run headless and only write PNG files
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import gradcache  # noqa: E402

from benchmarks.atomic_output import replaced, save_figure  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_peak_ratios(rows: dict[str, dict[str, Any]], peer: str, column: str) -> None:
    """row[column] = row's peak_mb / the `peer` row's, for each side's row (`rows`: side -> row) measured ok where
    the peer's was too."""
    theirs = rows.get(peer, {})
    if theirs.get("status") != "ok" or not theirs.get("peak_mb"):
        return
    for row in rows.values():
        if row.get("status") == "ok":
            row[column] = row["peak_mb"] / theirs["peak_mb"]


def machine_context(threads: int, device: str) -> dict[str, Any]:
    """Columns every row carries, so a figure can be judged later: load, threads, versions, time."""
    load_1m, load_5m, _ = os.getloadavg()
    return {
        "device": device,
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "loadavg_1m": round(load_1m, 2),
        "loadavg_5m": round(load_5m, 2),
        "torch_version": torch.__version__,
        "gradcache_version": gradcache.__version__,
        "python_version": platform.python_version(),
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Rows as CSV with a fixed column order; a key a row lacks is written empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A fixed-width text table of the given columns."""
    cells = [[_format(row.get(column, "")) for column in columns] for row in rows]
    widths = [max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)]
    print("  ".join(column.rjust(width) for column, width in zip(columns, widths)))
    for line in cells:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def plot_lines(path: Path, rows: Sequence[dict[str, Any]], x: str, panels: Sequence[tuple[str, str]],
               group: str, title: str, log_x: bool = True, log_y: bool = True) -> None:
    """One panel per (column, label) in ``panels``, one line per value of ``group``, points lacking y skipped."""
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    names = list(dict.fromkeys(row[group] for row in rows))
    for axis, (column, label) in zip(axes[0], panels):
        for name in names:
            points = sorted((row[x], row[column]) for row in rows
                            if row[group] == name and isinstance(row.get(column), (int, float))
                            and (row[column] > 0 or not log_y))  # a 0 MiB peak has no place on a log axis
            if points:
                style = "--" if "loss" in str(name) else "-"
                axis.plot(*zip(*points), style, marker="o", label=str(name))
        axis.set_xlabel(x.replace("_", " "))
        axis.set_ylabel(label)
        if log_x:
            axis.set_xscale("log", base=2)
        if log_y:
            axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, dpi=120)
    plt.close(figure)
