"""Make the benchmark scripts importable: they live in the checkout's benchmarks/ folder, not in a package,
and import their sibling modules by name, as when run as `python benchmarks/<script>.py`."""
from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture
def read_csv() -> Callable[[Path], tuple[list[str], list[dict[str, str]]]]:
    """path -> (header, rows) of a CSV a benchmark wrote."""
    return _read_csv
