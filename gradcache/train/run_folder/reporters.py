"""`--report-to`: where a run's logged rows go besides train_log.csv and eval_log.csv.

    --report-to none          (default) the CSV logs alone
    --report-to tensorboard   also RUN/tensorboard/ (tensorboard.py): train/<column> and eval/<metric> scalars
    --report-to wandb         also RUN/wandb/ (weights_and_biases.py): the same, as an offline W&B run

`RunLog` (log.py) is the one place that logs a row: it hands each row to every reporter opened here, so a
reporter sees exactly the CSV's rows at the CSV's step numbers. `check_report_to` runs before a run writes
anything (preflight), so a missing package is an exit status 2 naming what to install, not a crash at step 0.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gradcache.train.errors import UsageError


class Reporter(Protocol):
    def add_scalars(self, prefix: str, values: dict[str, float], step: int) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Reporting:
    """A `--report-to` choice: the package it needs, how to install it, and its writer."""

    package: str
    install: str
    open: Callable[[Path, int | None, dict[str, Any]], Reporter]  # (run folder, resume step, run options)


def _tensorboard(output_dir: Path, resume_step: int | None, run_options: dict[str, Any]) -> Reporter:
    from gradcache.train.run_folder.tensorboard import TensorBoardWriter

    return TensorBoardWriter(output_dir, resume_step)


def _wandb(output_dir: Path, resume_step: int | None, run_options: dict[str, Any]) -> Reporter:
    from gradcache.train.run_folder.weights_and_biases import WandbWriter

    return WandbWriter(output_dir, resume_step, run_options)


NONE = "none"
REPORTERS = {
    "tensorboard": Reporting("tensorboard", "pip install tensorboard (or pip install 'gradcache[tensorboard]')",
                             _tensorboard),
    "wandb": Reporting("wandb", "pip install wandb (or pip install 'gradcache[wandb]')", _wandb),
}
REPORT_TO = (NONE, *REPORTERS)  # the choices of --report-to


def reporters_of(report_to: Sequence[str] | None) -> list[str]:
    """The reporters `--report-to` names, in order, once each (`none` and no option: none)."""
    return list(dict.fromkeys(name for name in report_to or () if name != NONE))


def check_report_to(report_to: Sequence[str] | None) -> None:
    """Refuse an unknown name, `none` beside another name, or a reporter whose package is not installed.

    Raises:
        UsageError: naming the value and the choices, or the package and how to install it.
    """
    names = list(report_to or ())
    unknown = [name for name in names if name not in REPORT_TO]
    if unknown:
        raise UsageError(f"--report-to {unknown[0]!r} is not a reporter; choose from {', '.join(REPORT_TO)}")
    if NONE in names and len(set(names)) > 1:
        raise UsageError(f"--report-to {' '.join(names)}: 'none' reports nowhere and cannot go with another "
                         "reporter; drop it")
    for name in reporters_of(names):
        reporting = REPORTERS[name]
        try:
            __import__(reporting.package)
        except ImportError as error:
            raise UsageError(f"--report-to {name} needs the {reporting.package} package, which is not installed: "
                             f"{reporting.install}") from error


def open_reporters(report_to: Sequence[str] | None, output_dir: str | Path, resume_step: int | None,
                   run_options: dict[str, Any] | None = None) -> list[Reporter]:
    """A writer for each reporter `report_to` names, in `output_dir` (continuing a resumed run's)."""
    return [REPORTERS[name].open(Path(output_dir), resume_step, run_options or {}) for name in reporters_of(report_to)]
