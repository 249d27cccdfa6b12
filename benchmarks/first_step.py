"""One `gradcache train` command measured from its own fresh process and stopped at the end of step 1: the seconds
from the process's start to the end of step 1, and the peak anonymous memory (RssAnon, sampled every 5 ms) of the
process tree until then, the run and its data-loader workers, above the process's start and absolute.

The data scaling and torchrun benchmarks launch it; under `torchrun` each rank measures its own tree:

    FIRST_STEP_RESULTS=out/ python -m benchmarks.first_step -- train clip --data shards/ --steps 1 ...
    FIRST_STEP_RESULTS=out/ python -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m benchmarks.first_step -- train clip ...                      # out/rank-<rank>.json, one per process

Nothing but the standard library and `benchmarks.anon_memory` is imported before the baseline, so the figures
include importing torch and the program (the same at every data size).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.anon_memory import PeakAnon

RESULTS_ENV = "FIRST_STEP_RESULTS"  # the folder each process writes its rank-<rank>.json into (ranks share stdout)
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder that holds the benchmarks package


def process_age_s() -> float:
    """Seconds since this process started (the kernel's start time, 10 ms resolution)."""
    with open("/proc/self/stat", "rb") as handle:
        start_ticks = int(handle.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


class FirstStepDone(KeyboardInterrupt):
    """Raised after step 1 was logged: the program stops at once, as on Ctrl-C (exit status 130, no save)."""


def measure(argv: list[str]) -> dict[str, Any]:
    """Run `gradcache` `argv` in this process up to the end of step 1, then stop it; its exit status (0 when it
    reached step 1), the seconds from the process's start to the end of step 1 and the tree's peak RssAnon in MB
    until then, above the value at this call and absolute. The final evaluation, checkpoint and export, the same
    at every data size, are skipped: a save's peak could hide the data's, and they cost seconds a point."""
    peak = PeakAnon(tree=True)
    from gradcache.cli import main
    from gradcache.train.errors import INTERRUPTED
    from gradcache.train.run_folder.log import RunLog

    figures: dict[str, float] = {}
    log_step = RunLog.log_step

    def logged(self, row):  # every rank logs its steps (only rank 0 writes them); step 1 ended on this rank
        log_step(self, row)
        figures["first_step_s"] = round(process_age_s(), 2)
        above = peak.stop()
        figures["peak_rss_anon_mb"] = round(above / 2**20, 1)
        figures["peak_rss_anon_abs_mb"] = round((above + peak.baseline) / 2**20, 1)
        raise FirstStepDone("the benchmark measured step 1")

    RunLog.log_step = logged
    try:
        status = main(argv)
    finally:
        RunLog.log_step = log_step
    reached = bool(figures) and status == INTERRUPTED
    return {"rank": int(os.environ.get("RANK", 0)), "status": 0 if reached else status or "no step", **figures}


def run(argv: list[str], ranks: int = 1, timeout_s: float | None = None,
        env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`gradcache` `argv` in a fresh process (`ranks` 1) or under torchrun on `ranks` local processes (gloo on
    CPU), one result per rank in rank order. Paths in `argv` must be absolute: the command runs in the checkout.

    Raises:
        RuntimeError: a rank reported no result or a non-zero status, with the command's last lines.
    """
    module = ["-m", "benchmarks.first_step", "--", *argv]
    command = [sys.executable, *module] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *module]
    with tempfile.TemporaryDirectory(prefix="first_step-") as folder:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=CHECKOUT,
                              env={**os.environ, **(env or {}), RESULTS_ENV: folder})
        results = sorted((json.loads(path.read_text()) for path in Path(folder).glob("rank-*.json")),
                         key=lambda result: result["rank"])
    if done.returncode != 0 or len(results) != ranks or any(r["status"] != 0 for r in results):
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"gradcache {' '.join(argv[:2])} on {ranks} rank(s) exited {done.returncode} with "
                           f"{len(results)} result(s): {tail}")
    return results


if __name__ == "__main__":
    arguments = sys.argv[1:]
    result = measure(arguments[1:] if arguments[:1] == ["--"] else arguments)
    if RESULTS_ENV not in os.environ:  # run by hand
        print(json.dumps(result))
    else:
        target = Path(os.environ[RESULTS_ENV]) / f"rank-{result['rank']}.json"
        target.with_suffix(".partial").write_text(json.dumps(result))
        os.replace(target.with_suffix(".partial"), target)  # whole or absent, whenever the parent reads it
    raise SystemExit(0)
