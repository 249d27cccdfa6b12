"""Shared helpers of the benchmark smoke tests (the benchmarks are the checkout's `benchmarks` package)."""
from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest



def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture
def read_csv() -> Callable[[Path], tuple[list[str], list[dict[str, str]]]]:
    """path -> (header, rows) of a CSV a benchmark wrote."""
    return _read_csv
