"""Anonymous memory (RssAnon) of this process, or of its process tree, and its peak over a stretch of work sampled
every 5 ms: what the data and tensors a run holds cost, not the page cache of the files it reads (memory-mapped
pages do not count).

The tree is this process and its descendants (data-loader workers are child processes). Its RssAnon is the sum
of theirs, so pages a forked child still shares copy-on-write with its parent count once per process: a
comparison between data sizes at the same `--workers` is fair, one between worker counts is not.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

RESCAN_S = 0.1  # how often the tree's members are looked up again (a /proc scan costs about 1 ms)


def rss_anon_bytes(pid: int | str = "self") -> int:
    """RssAnon of process `pid` in bytes; 0 for a process that has ended."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024  # kB
    except (FileNotFoundError, ProcessLookupError):  # it ended between the listing and the read
        pass
    return 0


def _children_from_tasks(pid: int) -> list[int] | None:
    """The children of `pid` from /proc/PID/task/*/children, or None where the kernel does not show that file."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []  # it ended
    for task in tasks:
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except FileNotFoundError:
            if not (task / "stat").exists():
                continue  # the thread ended
            return None  # CONFIG_PROC_CHILDREN is off
        except OSError:
            continue
    return found


def _parents() -> dict[int, int]:
    """pid -> ppid of every process in /proc."""
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                # the name in parentheses may hold spaces; the state and ppid follow its closing parenthesis
                parents[int(entry.name)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # it ended while we looked
            pass
    return parents


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children, ...), not `pid` itself."""
    found, frontier = [], [pid]
    children = _children_from_tasks(pid)
    if children is None:  # no children files: one scan of /proc for parent links
        parents = _parents()
        while frontier:
            parent = frontier.pop()
            below = [child for child, its_parent in parents.items() if its_parent == parent]
            found.extend(below)
            frontier.extend(below)
        return found
    while frontier:
        below = _children_from_tasks(frontier.pop()) or []
        found.extend(below)
        frontier.extend(below)
    return found


class PeakAnon:
    """The largest RssAnon seen by a 5 ms sampler since construction, of this process or with `tree=True` of this
    process plus its descendants (re-listed every 0.1 s, so a child started later counts from then on);
    `stop()` returns it above the value at construction, `stop(absolute=True)` as it is."""

    def __init__(self, tree: bool = False) -> None:
        self.tree = tree
        self._members: list[int] = []
        self._listed_at = 0.0
        self.baseline = self.peak = self.current()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def current(self) -> int:
        """RssAnon now: this process's, or the sum over its tree."""
        if not self.tree:
            return rss_anon_bytes()
        now = time.monotonic()
        if now - self._listed_at >= RESCAN_S:
            self._members, self._listed_at = descendants(os.getpid()), now
        return rss_anon_bytes() + sum(rss_anon_bytes(pid) for pid in self._members)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            time.sleep(0.005)

    def stop(self, absolute: bool = False) -> int:
        self._stop.set()
        self._thread.join()
        peak = max(self.peak, self.current())
        return peak if absolute else peak - self.baseline
