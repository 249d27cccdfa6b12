"""The progress of `gradcache train` on stderr: a tqdm bar on a terminal; elsewhere (a cluster job's log, a pipe,
a file) one line every `--progress-every` seconds, since a bar there is either noise or, turned off, silence:

    gradcache train simclr: step 120/1000 (12%), loss 3.1416, 512.0 samples/s, elapsed 1m 02s, ETA 7m 35s

Before the first step, one line per start-up phase that can take seconds (`startup_phase`: reading the data,
loading the model, the step-0 evaluation), so a log is not silent while the run prepares:

    gradcache train text: loading the model (--model all-MiniLM-L6-v2)

`--quiet` silences all of them; ranks other than 0 print nothing.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["StepProgress", "duration", "startup_phase"]


def duration(seconds: float) -> str:
    """`seconds` as `1h 02m`, `7m 35s` or `42s`."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def startup_phase(mode: str, what: str, enabled: bool, stream: TextIO | None = None) -> None:
    """One line on stderr (`stream`): `gradcache train MODE: WHAT`, as a start-up phase begins; nothing unless
    `enabled` (rank 0, without --quiet)."""
    if enabled:
        print(f"gradcache train {mode}: {what}", file=stream if stream is not None else sys.stderr, flush=True)


class StepProgress:
    """Shows the steps of a run of `total` steps that starts at step `start` (a resume starts past 0).

    Args:
        description: what runs (`gradcache train simclr`), at the head of each line.
        every: seconds between two lines when stderr is not a terminal (0: a line per step). The first step and
            the last always print a line.
        enabled: False on ranks other than 0, and with `--quiet`.
        stream, clock: stderr and `time.monotonic` (tests give others); a terminal `stream` gets a tqdm bar.
    """

    def __init__(self, total: int, start: int, description: str, every: float, enabled: bool = True,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.start, self.description, self.every = total, start, description, every
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        terminal = self.stream.isatty()
        self.bar = tqdm(total=total, initial=start, desc=description, file=self.stream, dynamic_ncols=True,
                        disable=not (enabled and terminal))
        self.lines = enabled and not terminal
        self.started = clock()
        self.printed: float | None = None  # when the last line was printed

    def update(self, row: dict[str, Any]) -> None:
        """One step done; `row` is its train_log.csv row (`step` is the steps done, counted from 1)."""
        self.bar.update(1)
        self.bar.set_postfix(loss=row["loss"][:6], lr=row["lr"], samples_s=row["samples_per_s"],
                             negatives=row["negatives_per_anchor"])
        if not self.lines:
            return
        now, done = self.clock(), int(row["step"])
        if self.printed is not None and now - self.printed < self.every and done != self.total:
            return
        self.printed = now
        elapsed = now - self.started
        remaining = elapsed / (done - self.start) * (self.total - done) if done > self.start else 0.0
        print(f"{self.description}: step {done}/{self.total} ({100 * done // max(self.total, 1)}%), loss "
              f"{float(row['loss']):.4f}, {row['samples_per_s']} samples/s, elapsed {duration(elapsed)}, ETA "
              f"{duration(remaining)}", file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()
