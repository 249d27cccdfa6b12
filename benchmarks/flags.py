"""The command-line options the benchmark scripts share, with one spelling and one help text each: timed steps,
threads, device, the budgets of a fresh-process sweep, and where the CSV and PNG go; and the checks of their
values, as the program checks its own: a bad value exits 2 with one line naming the option (`OptionParser`), before
anything runs or is written (`finite_positive`, `whole_number`, `device_option`, `writable_folder`).

Output: by default a new folder `runs/benchmarks/<name>-<time>` under the working directory, so a run never
overwrites the figures the READMEs show; `--write-results` writes into `benchmarks/results/` (those figures)."""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch

from benchmarks.report import RESULTS_DIR

# The data benchmarks' generated data sets and their runs (text_data_scaling, image_data_scaling, data_wait,
# torchrun_memory: one copy of each data set, reused), kept apart from the output folder and benchmarks/results.
DATA_DIR = "runs/benchmarks/data"


class OptionParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line, `PROG: error: MESSAGE`, and exit status 2 (argparse's own
    status; its usage lines are left out, as the program leaves them out: --help shows them)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default once: appended where the help does not state it and the default says something
    (not None, not a False switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def add_shared_options(parser: argparse.ArgumentParser, name: str, *, threads: int = 2,
                       timed_steps: int | None = None, memory_budget_gb: float | None = None,
                       time_budget_s: float | None = None, threads_help: str | None = None) -> None:
    """Add `--threads --device --output-dir --name` to `parser`, and where given a default:
    `--steps --warmup` (timed steps per point, median reported) and `--memory-budget-gb --time-budget-s` with
    the hidden `--point` through which `fresh_process.run_point` runs one point of a sweep.

    Args:
        name: default file stem of the CSV and PNG.
        threads: default of `--threads`.
        threads_help: what `--threads` sets, where it is not torch.set_num_threads in each point.
    """
    if timed_steps is not None:
        parser.add_argument("--steps", type=int, default=timed_steps, help="timed steps per point (median reported)")
        parser.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    parser.add_argument("--threads", type=int, default=threads,
                        help=threads_help or "torch.set_num_threads in each point (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    if memory_budget_gb is not None:
        parser.add_argument("--memory-budget-gb", type=float, default=memory_budget_gb,
                            help="a point above this is stopped and recorded as such")
        parser.add_argument("--time-budget-s", type=float, default=time_budget_s,
                            help="a point longer than this is stopped and recorded as such")
        parser.add_argument("--point", default=None, help=argparse.SUPPRESS)  # internal: run one point, print JSON
    add_output_options(parser, name)


def add_output_options(parser: argparse.ArgumentParser, name: str) -> None:
    """`--output-dir`, `--write-results` and `--name` (default file stem `name`); see `output_folder`."""
    parser.add_argument("--name", default=name, help="file stem of the CSV and PNG")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output-dir", default=None,
                       help="where the CSV and PNG go (default: a new folder runs/benchmarks/<name>-<time>)")
    where.add_argument("--write-results", action="store_true",
                       help=f"write into {RESULTS_DIR}, the committed figures the READMEs show")


def output_folder(args: argparse.Namespace) -> Path:
    """The folder this run writes to, created: `--output-dir`, `benchmarks/results/` with `--write-results`,
    else a new `runs/benchmarks/<name>-<time>`."""
    if args.write_results:
        folder = RESULTS_DIR
    elif args.output_dir is not None:
        folder = Path(args.output_dir)
    else:
        folder = Path("runs") / "benchmarks" / f"{args.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def integer_list(text: str, flag: str) -> list[int]:
    """`"0,1,2"` -> [0, 1, 2]; a ValueError naming `flag` for anything else, or for no value at all."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag}={text!r} must be comma-separated integers, e.g. 0,1,2.") from None
    if not values:
        raise ValueError(f"{flag}={text!r} names no value; give at least one, e.g. 0.")
    return values


def choices(value: str, valid: Sequence[str], flag: str) -> list[str]:
    """The comma-separated names of `value`, each one of `valid` (ValueError naming `flag` and the choices)."""
    chosen = value.split(",")
    for name in chosen:
        if name not in valid:
            raise ValueError(f"{flag}: unknown value {name!r}; choose from {', '.join(valid)}")
    return chosen


def finite_positive(value: float, flag: str, unit: str) -> float:
    """`value` when it is a finite number above 0; a ValueError naming `flag` (NaN and infinity included)."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} {value:g} must be a finite number above 0 ({unit})")
    return value


def whole_number(value: int, flag: str, lowest: int, highest: int, why: str = "") -> int:
    """`value` when lowest <= value <= highest; a ValueError naming `flag`, the bounds and `why` the upper one."""
    if not lowest <= value <= highest:
        raise ValueError(f"{flag} {value} must be from {lowest:,} to {highest:,}{f' ({why})' if why else ''}")
    return value


def device_option(text: str, flag: str = "--device") -> torch.device:
    """The device `text` names: cpu, cuda or cuda:N (N below the GPU count where CUDA is here); a ValueError naming
    `flag` for anything else (meta holds no data, cuda:-1 is no GPU)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"{flag} {text}: not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index not in (None, 0)):
        raise ValueError(f"{flag} {text}: a benchmark runs on cpu, cuda or cuda:N")
    if device.type == "cuda" and device.index is not None and torch.cuda.is_available() \
            and device.index >= torch.cuda.device_count():
        raise ValueError(f"{flag} {text}: this machine has {torch.cuda.device_count()} GPU(s); use cuda or cuda:N "
                         "below that count")
    return device


def writable_folder(path: Path, flag: str) -> Path:
    """`path` as a folder this process can write in, created with its parents; a ValueError naming `flag` where it
    is a file, or cannot be created or written."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: a file, not a folder; give a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {path}: cannot write there ({error.strerror or error}); give a folder this user "
                         "can write") from None
    return path
