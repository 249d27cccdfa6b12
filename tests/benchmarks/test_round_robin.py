"""benchmarks/round_robin.py: every configuration once per round in a rotated order, and ratios as medians of
per-round ratios."""
from __future__ import annotations

import statistics

import torch

from benchmarks.round_robin import medians, per_round_ratio, round_robin


def test_each_round_runs_every_step_once_in_an_order_rotated_by_one() -> None:
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = round_robin(steps, 3, torch.device("cpu"))
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")  # the warm-up, then rounds 1 to 3
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_a_ratio_is_the_median_of_the_per_round_ratios_not_the_ratio_of_medians() -> None:
    times = {"gc": [2.0, 3.0, 10.0], "naive": [1.0, 1.0, 9.0], "forward": [1.0, 2.0, 1.0]}
    per_round = [g / (n + f) for g, n, f in zip(times["gc"], times["naive"], times["forward"])]
    assert per_round_ratio(times, "gc", ["naive", "forward"]) == statistics.median(per_round) == 1.0
    assert medians(times)["gc"] / (medians(times)["naive"] + medians(times)["forward"]) != 1.0
