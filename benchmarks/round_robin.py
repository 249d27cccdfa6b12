"""Configurations timed in turn in one process: round r runs each once, in an order rotated by r, so a change of
the machine's load (or of its clock, or of the allocator's state) falls on all of them alike.

A figure is the median over rounds of a configuration's seconds; a ratio between configurations is the median
over rounds of the per-round ratio, which cancels a drift that the ratio of two medians would keep.
"""
from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence

import torch

from benchmarks.fresh_process import seconds_of


def round_robin(steps: dict[str, Callable[[], None]], rounds: int, device: torch.device) -> dict[str, list[float]]:
    """name -> the seconds of each round's call of `steps[name]`, after one untimed warm-up call of each.
    Prints every round's times on stderr as it ends."""
    names = list(steps)
    for name in names:
        steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(seconds_of(steps[name], device))
        print(f"round {index + 1}/{rounds}: " + ", ".join(f"{name} {t[-1]:.3f} s" for name, t in times.items()),
              file=sys.stderr, flush=True)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in times.items()}


def per_round_ratio(times: dict[str, list[float]], numerator: str, denominator: Sequence[str]) -> float:
    """median over rounds r of times[numerator][r] / sum(times[d][r] for d in denominator)."""
    rounds = zip(times[numerator], *(times[d] for d in denominator))
    return statistics.median(top / sum(bottom) for top, *bottom in rounds)
