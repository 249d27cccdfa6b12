"""The command-line options the benchmark scripts share, with one spelling and one help text each: timed steps,
threads, device, the budgets of a fresh-process sweep, and where the CSV and PNG go."""
from __future__ import annotations

import argparse

from report import RESULTS_DIR


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
    parser.add_argument("--output-dir", default=str(RESULTS_DIR), help="where the CSV and PNG go")
    parser.add_argument("--name", default=name, help="file stem of the CSV and PNG")
