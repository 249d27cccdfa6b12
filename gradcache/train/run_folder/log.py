"""What a run leaves in its output folder: `train_log.csv` per step (`skipped` is 1 where an fp16 run's gradient
scaler found an overflow and skipped the optimizer step), `eval_log.csv` per evaluation,
`metrics.json` (the run summary) and `curves.png` (loss and evaluation curves); with `--report-to`, the same
rows to each reporter (reporters.py: TensorBoard, W&B), so there is one place that logs a row.

On resume the logs are cut back to the checkpoint's step and continued, so a resumed run's logs read as those
of one uninterrupted run.
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from gradcache.train.run_folder.reporters import Reporter, open_reporters

TRAIN_LOG, EVAL_LOG, METRICS = "train_log.csv", "eval_log.csv", "metrics.json"  # file names in the run folder
TRAIN_COLUMNS = ["step", "epoch", "loss", "lr", "samples_per_s", "negatives_per_anchor", "temperature",
                 "elapsed_s", "skipped", "data_wait_s"]


def _truncate_csv(path: Path, last_step: int, columns: list[str] | None = None) -> None:
    """Keep the header and the rows with step <= last_step; with `columns`, rewrite them in those columns (a
    log of an older version gains the new ones, empty)."""
    if not path.exists():
        return
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) <= last_step]
    if columns is not None and kept and kept[0] != columns:
        kept = [columns] + [[dict(zip(kept[0], row)).get(name, "") for name in columns] for row in kept[1:]]
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(kept)


def read_csv(path: str | os.PathLike) -> list[dict[str, float]]:
    """The rows of a log as dicts of floats (empty cells become NaN)."""
    with open(path, newline="") as handle:
        return [{k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(handle)]


class RunLog:
    """Appends rows to the run's CSV logs and hands them to the `report_to` reporters (`--report-to`), writes its
    summary; inert when `enabled` is False (rank > 0). Close it (or use it as a context manager) on every way
    out: a reporter's last rows reach its files then."""

    def __init__(self, output_dir: str | os.PathLike, resume_step: int | None = None, enabled: bool = True,
                 report_to: Sequence[str] | None = None, run_options: dict[str, Any] | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.enabled = enabled
        self.train_path = self.output_dir / TRAIN_LOG
        self.eval_path = self.output_dir / EVAL_LOG
        self._reporters: list[Reporter] = []
        if not enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            for path in (self.train_path, self.eval_path):
                path.unlink(missing_ok=True)
        else:
            _truncate_csv(self.train_path, resume_step, TRAIN_COLUMNS)
            _truncate_csv(self.eval_path, resume_step)
        self._eval_columns: list[str] | None = None
        if self.eval_path.exists():
            with open(self.eval_path, newline="") as handle:
                self._eval_columns = next(csv.reader(handle), None)
        self._reporters = open_reporters(report_to, self.output_dir, resume_step, run_options)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def flush(self) -> None:
        """Write what the reporters hold to their files (at each checkpoint: what a resume keeps is on disk)."""
        for reporter in self._reporters:
            reporter.flush()

    def close(self) -> None:
        """Flush and close the reporters; the CSV logs need nothing (each row is written when logged)."""
        reporters, self._reporters = self._reporters, []
        for reporter in reporters:
            reporter.close()

    def log_step(self, row: dict[str, Any]) -> None:
        """One training step; columns TRAIN_COLUMNS (missing ones left empty)."""
        if not self.enabled:
            return
        new = not self.train_path.exists()
        with open(self.train_path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=TRAIN_COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(row)
        self._report("train", {column: row.get(column) for column in TRAIN_COLUMNS[1:]}, int(row["step"]))

    def skipped_steps(self) -> int:
        """How many logged steps the fp16 gradient scaler skipped (resumed runs included)."""
        if not self.enabled or not self.train_path.exists():
            return 0
        return sum(1 for row in read_csv(self.train_path) if row.get("skipped", 0) == 1)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        """One evaluation at `step` (the first call fixes the columns)."""
        if not self.enabled:
            return
        if self._eval_columns is None:
            self._eval_columns = ["step", *metrics]
            with open(self.eval_path, "w", newline="") as handle:
                csv.writer(handle).writerow(self._eval_columns)
        with open(self.eval_path, "a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=self._eval_columns, extrasaction="ignore").writerow(
                {"step": step, **metrics}
            )
        self._report("eval", {column: metrics.get(column) for column in self._eval_columns[1:]}, step)

    def _report(self, prefix: str, row: dict[str, Any], step: int) -> None:
        """The row's cells as numbers to every reporter (cells the CSV leaves empty: none)."""
        if self._reporters:
            values = {name: float(value) for name, value in row.items() if value is not None and value != ""}
            for reporter in self._reporters:
                reporter.add_scalars(prefix, values, step)

    def write_metrics(self, metrics: dict[str, Any], name: str = METRICS) -> Path | None:
        """The run summary as JSON (written to a temporary file, then renamed)."""
        if not self.enabled:
            return None
        path = self.output_dir / name
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, path)
        return path

    def plot(self) -> Path | None:
        """`curves.png` (see `draw_curves`)."""
        if not self.enabled or not self.train_path.exists():
            return None
        import matplotlib.pyplot as plt

        figure = draw_curves(read_csv(self.train_path), read_csv(self.eval_path) if self.eval_path.exists() else [])
        path = self.output_dir / "curves.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return path


def draw_curves(train: list[dict[str, float]], evals: list[dict[str, float]]):
    """The training loss per step, and each evaluation metric at its steps in a colour of its own; the
    `chance_` levels as one labelled grey band, not a line each; the legend outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = [key for key in (evals[0] if evals else {}) if key != "step"]
    scores = [key for key in keys if not key.startswith("chance_")]
    chance = [row[key] for row in evals for key in keys if key.startswith("chance_") and math.isfinite(row[key])]
    figure, (loss_axis, eval_axis) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=(1, 1.25))
    loss_axis.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, color="tab:blue")
    loss_axis.set(xlabel="step", ylabel="loss", title="training loss")
    colours = plt.get_cmap("tab10" if len(scores) <= 10 else "tab20").colors
    steps = [r["step"] for r in evals]
    for colour, key in zip(colours, scores):
        eval_axis.plot(steps, [r[key] for r in evals], marker="o", color=colour, label=key)
    if chance:
        eval_axis.axhspan(min(chance), max(chance), color="0.88", zorder=0,
                          label=f"chance levels ({min(chance):.2g} to {max(chance):.2g})")
    eval_axis.set(xlabel="step", ylabel="score (%)", title="evaluation (held-out split)")
    for axis in (loss_axis, eval_axis):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    if scores:
        eval_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    figure.tight_layout()
    return figure
