"""One case of the prepared GPU run: its plan (peak bytes by arithmetic, estimated seconds), made before it runs,
and `run_case`, which runs it alone and turns whatever happens into one row: its measurements, or the error or
out-of-memory that stopped it, or the cap that skipped it. The memory is freed (gc, the CUDA cache) before each
case, so a case starts from what the run holds between cases, whatever the one before it left."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MEMORY_TOLERANCE = 0.10  # a measured peak above planned * (1 + this) fails a case that checks its plan


@dataclass(frozen=True)
class Case:
    """`run(device)` returns the case's measurements (`step_s`, `max_rel_error`, ...) and, where it fails,
    `failure`: why, in words.

    planned_peak_bytes: what the case allocates at most on the device above its start, by arithmetic.
    check_memory: the case fails when its measured peak exceeds the plan by more than MEMORY_TOLERANCE.
    """

    section: str
    name: str
    planned_peak_bytes: int
    estimated_s: float
    run: Callable[[torch.device], dict[str, Any]]
    check_memory: bool = False

    def plan(self) -> dict[str, Any]:
        return {"section": self.section, "case": self.name, "planned_peak_bytes": int(self.planned_peak_bytes),
                "estimated_s": round(self.estimated_s, 1)}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def skipped(case: Case, cap_bytes: int | None) -> dict[str, Any]:
    return {**case.plan(), "status": "skipped", "measured_peak_bytes": None, "step_s": None, "max_rel_error": None,
            "error": f"planned {case.planned_peak_bytes / 2**30:.3g} GiB > --memory-cap-gb "
                     f"{(cap_bytes or 0) / 2**30:.3g}"}


def run_case(case: Case, device: torch.device) -> dict[str, Any]:
    """The case's row: status `ok`, `failed` (an exception, a failed check, or a measured peak above the plan)
    or `oom`; measured_peak_bytes is `torch.cuda.max_memory_allocated` above the allocation at the case's start
    (None off CUDA); `total_s` is the case's wall time, set-up included."""
    free_memory(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        start_bytes = torch.cuda.memory_allocated(device)
    row: dict[str, Any] = {**case.plan(), "status": "ok", "measured_peak_bytes": None, "step_s": None,
                           "max_rel_error": None, "error": None}
    started = time.perf_counter()
    try:
        row.update(case.run(device))
    except torch.OutOfMemoryError as error:  # before the generic case: CUDA's OOM is a RuntimeError too
        row.update(status="oom", error=_first_line(error))
    except Exception as error:  # noqa: BLE001 - one case's failure is recorded and the run goes on
        row.update(status="failed", error=f"{type(error).__name__}: {_first_line(error)}")
    row["total_s"] = round(time.perf_counter() - started, 3)
    if cuda:
        torch.cuda.synchronize(device)
        row["measured_peak_bytes"] = torch.cuda.max_memory_allocated(device) - start_bytes
    failure = row.pop("failure", None)
    if failure and row["status"] == "ok":
        row.update(status="failed", error=failure)
    measured, planned = row["measured_peak_bytes"], case.planned_peak_bytes
    if case.check_memory and row["status"] == "ok" and measured is not None and measured > planned * (1 + MEMORY_TOLERANCE):
        row.update(status="failed", error=f"measured peak {measured / 2**20:.1f} MiB > planned {planned / 2**20:.1f} "
                                          f"MiB + {MEMORY_TOLERANCE:.0%}")
    return row


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else repr(error)


def estimated_seconds(flops: float, device: torch.device, overhead_s: float = 1.0) -> float:
    """`flops` at a conservative 20 TFLOP/s on a GPU (float32 without TF32 on an H100 is about 50) or 20 GFLOP/s
    on a CPU, plus `overhead_s` of set-up (building, the first call's kernels)."""
    return flops / (2e13 if device.type == "cuda" else 2e10) + overhead_s
