"""benchmarks/anon_memory.py: a child process's anonymous memory counts in the tree's peak, not in the process's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.anon_memory import PeakAnon

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")


def test_a_child_counts_in_the_tree_and_not_in_the_process() -> None:
    tree, alone = PeakAnon(tree=True), PeakAnon()
    # 64 MiB written, so its pages are resident, held 0.5 s: several of the tree's 0.1 s re-listings see it
    subprocess.run([sys.executable, "-c", "import time; held = bytearray(64 * 2**20); time.sleep(0.5)"], check=True)
    assert tree.stop() > 60 * 2**20
    assert alone.stop() < 16 * 2**20
