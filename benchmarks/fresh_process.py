"""Run one benchmark point in a fresh Python process and read back its JSON result; measure peak memory there.

Peak memory is a high-water mark, so a process that already ran a larger point would report that one's peak.
Each point therefore re-runs its module (``python -m benchmarks.<name> --point '<json>'``); the child prints
one JSON line last.
On CPU the figure is peak RSS (``ru_maxrss``) above the child's baseline; on CUDA it is
``torch.cuda.max_memory_allocated``. A memory budget is enforced by a watchdog thread in the child, a time
budget by the parent's timeout; a point over either is recorded with its status and the sweep goes on.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULT_PREFIX = "BENCHMARK_RESULT "
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder that holds the benchmarks package
OVER_MEMORY_EXIT = 3  # the child's exit status when its watchdog saw RSS over the budget
# glibc's malloc keeps freed blocks in its heap and raises its own mmap threshold as it goes, so a CPU child's
# peak RSS also holds the heap's fragmentation, which differs between points with chunks of different shapes
# (trim_padding, chunk_tokens) by hundreds of MiB. With every block of 64 KiB or more mapped on its own and
# returned at free, the peak RSS follows the live tensors, as torch.cuda.max_memory_allocated does on CUDA.
LIVE_TENSORS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def rss_peak_bytes() -> int:
    """This process's peak resident set size so far: its own memory's high-water mark (VmHWM) where Linux
    shows it. ru_maxrss is not that: across exec it keeps the parent's high-water mark, so a child started by a
    large parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak memory of what runs after construction, above the baseline at construction, in bytes."""

    def __init__(self, device: torch.device, budget_bytes: int | None) -> None:
        self.device = device
        self._stopped = threading.Event()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.baseline = torch.cuda.memory_allocated(device)
            if budget_bytes:  # a caching-allocator cap, so the point fails as an OOM past the budget
                total = torch.cuda.get_device_properties(device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        else:
            self.baseline = rss_peak_bytes()
            if budget_bytes:
                threading.Thread(target=self._watch, args=(budget_bytes,), daemon=True).start()

    def stop(self) -> None:
        """End the watchdog, so a caller that measures in-process (a test) keeps its process."""
        self._stopped.set()

    def _watch(self, budget_bytes: int) -> None:
        start = _rss_now_bytes()  # current RSS, not the high-water mark: it is what the polls compare against
        while not self._stopped.is_set():
            if _rss_now_bytes() - start > budget_bytes:
                report({"status": "over_memory_budget"})
                os._exit(OVER_MEMORY_EXIT)
            time.sleep(0.01)

    def peak_above_baseline(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.baseline
        return rss_peak_bytes() - self.baseline


def reset_peak_rss() -> None:
    """Restart this process's peak RSS (VmHWM) from its current RSS: imports and setup before it stop counting."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def measured_step(step: Callable[[], float], device: torch.device, memory_budget_gb: float, repeats: int,
                  long_run_s: float) -> dict[str, Any]:
    """`step()` once from a fresh peak mark: its peak above the mark (`PeakMemory`, GiB) and its return value (the
    loss); then its time, the median of `repeats` more calls, or that first call's own when it took longer than
    `long_run_s` or `repeats` < 1. Returns `peak_gb`, `loss_value`, `step_s`, `runs`."""
    if device.type == "cpu":
        reset_peak_rss()
    peak = PeakMemory(device, int(memory_budget_gb * 2**30))
    started = time.perf_counter()
    loss_value = step()
    first_s = time.perf_counter() - started
    peak_bytes = peak.peak_above_baseline()
    peak.stop()
    if first_s > long_run_s or repeats < 1:
        step_s, runs = first_s, 1
    else:
        step_s, times = median_time(step, repeats, 0, device)
        runs = len(times)
    return {"peak_gb": peak_bytes / 2**30, "loss_value": loss_value, "step_s": step_s, "runs": runs}


def report(result: dict[str, Any]) -> None:
    """The child's last line: its result for the parent to parse."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_point(module: str, point: dict[str, Any], time_budget_s: float | None,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module --point JSON`` and return its result dict, or a status saying why there is none.

    The child runs in the checkout that holds this package, so it finds the same ``benchmarks`` whatever the
    caller's working directory, with `env` added to this process's environment (`LIVE_TENSORS_ENV`: peak RSS
    without the heap's fragmentation)."""
    command = [sys.executable, "-m", module, "--point", json.dumps(point)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=time_budget_s, cwd=CHECKOUT,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"status": "over_time_budget"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if lines:
        result = json.loads(lines[-1][len(RESULT_PREFIX):])
    elif done.returncode in (-9, 137):  # the kernel's OOM killer
        result = {"status": "oom"}
    else:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        result = {"status": "error", "error": " | ".join(tail)}
    result["process_s"] = round(time.perf_counter() - started, 2)
    return result


def seconds_of(function: Any, device: torch.device) -> float:
    """Wall seconds of one ``function()`` call, the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def median_time(function: Any, repeats: int, warmup: int, device: torch.device) -> tuple[float, list[float]]:
    """Median wall time of ``function()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        function()
    times = [seconds_of(function, device) for _ in range(repeats)]
    ordered = sorted(times)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return median, times
