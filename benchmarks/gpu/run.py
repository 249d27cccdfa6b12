"""`python -m benchmarks.gpu --out DIR`: build the plan of every case, print it, then run the cases one by one,
each row appended to DIR/gpu.jsonl as the case ends."""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.flags import HelpFormatter, OptionParser, choices, device_option, finite_positive, writable_folder
from benchmarks.gpu import lora, memory, program, replay, speed, tiled, vlm
from benchmarks.gpu.case import Case, device_name, run_case, skipped
from benchmarks.gpu.journal import FILE_NAME, Journal
from benchmarks.gpu.sizes import SIZES, Sizes
from benchmarks.report import machine_context, print_table

GB = 2**30
SECTIONS: dict[str, Callable[[Sizes, torch.device], list[Case]]] = {
    "replay": replay.cases,
    "memory": memory.cases,
    "speed": speed.cases,
    "tiled": tiled.cases,
    "lora": lora.cases,
    "vlm": vlm.cases,
    "program": program.cases,
}


def get_args_parser() -> argparse.ArgumentParser:
    parser = OptionParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder of {FILE_NAME} (default: a new runs/benchmarks/gpu-<time>)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda, cuda:N or cpu (default: cuda where there is one)")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="gpu or smoke (default: gpu on a CUDA device, smoke on the CPU)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated sections to run, in this order")
    parser.add_argument("--memory-cap-gb", type=float, default=None,
                        help="skip every case whose planned peak exceeds this (default: the device's free memory, "
                             "torch.cuda.mem_get_info; on the CPU the available RAM)")
    parser.add_argument("--plan-only", action="store_true", help="print the plan and run nothing")
    return parser


def default_cap_bytes(device: torch.device) -> int | None:
    """The device's free memory; on the CPU the available RAM (None where the system does not say)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def build_plan(sizes: Sizes, device: torch.device, sections: Sequence[str]) -> list[Case]:
    return [case for section in sections for case in SECTIONS[section](sizes, device)]


def print_plan(plan: Sequence[Case], cap_bytes: int | None) -> None:
    rows = [{**case.plan(), "planned_gib": case.planned_peak_bytes / GB,
             "runs": "yes" if cap_bytes is None or case.planned_peak_bytes <= cap_bytes else "skipped: over the cap"}
            for case in plan]
    print_table(rows, ["section", "case", "planned_gib", "estimated_s", "runs"])
    ran = [case for case, row in zip(plan, rows) if row["runs"] == "yes"]
    cap = "none" if cap_bytes is None else f"{cap_bytes / GB:.3g} GiB"
    print(f"plan: {len(plan)} cases, {len(ran)} within the memory cap ({cap}), estimated "
          f"{sum(case.estimated_s for case in ran):.0f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """0 when every case that ran is `ok` (skipped ones aside), 1 when one was not or when every case was skipped,
    2 for a bad argument (one line naming it, before anything runs or is written)."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    folder = args.out or Path("runs") / "benchmarks" / f"gpu-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        sections = choices(args.sections, list(SECTIONS), "--sections")
        if args.memory_cap_gb is not None:
            finite_positive(args.memory_cap_gb, "--memory-cap-gb", "GB, e.g. 70")
        device = device_option(args.device)
        absent = device.type == "cuda" and not torch.cuda.is_available()  # a plan alone needs no device
        if absent and not args.plan_only:
            raise ValueError(f"--device {args.device}: CUDA is not available here; use --device cpu (smoke size)")
        if not args.plan_only:
            writable_folder(folder, "--out")
    except ValueError as error:
        parser.error(str(error))
    sizes = SIZES[args.size or ("gpu" if device.type == "cuda" else "smoke")]
    if args.memory_cap_gb is not None:
        cap_bytes: int | None = int(args.memory_cap_gb * GB)
    else:
        cap_bytes = None if absent else default_cap_bytes(device)
    plan = build_plan(sizes, device, sections)
    print(f"benchmarks.gpu on {'no CUDA device' if absent else device_name(device)} ({args.device}), "
          f"{sizes.name} size", flush=True)
    print_plan(plan, cap_bytes)
    if args.plan_only:
        return 0
    context = {**machine_context(torch.get_num_threads(), args.device), "device": device_name(device),
               "device_arg": args.device, "size": sizes.name}
    journal = Journal(folder, context)
    statuses = []
    for index, case in enumerate(plan, 1):
        if cap_bytes is not None and case.planned_peak_bytes > cap_bytes:
            row = skipped(case, cap_bytes)
        else:
            print(f"[{index}/{len(plan)}] {case.section}/{case.name} ...", flush=True)
            row = run_case(case, device)
        journal.write(row)
        statuses.append(row["status"])
        print(f"[{index}/{len(plan)}] {case.section}/{case.name}: {row['status']}"
              + (f" ({row['error']})" if row.get("error") else ""), flush=True)
    print(f"wrote {journal.path}: " + ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)))
    if statuses and all(status == "skipped" for status in statuses):
        print(f"every case was skipped: each plans more than the memory cap ({cap_bytes / GB:.3g} GiB); nothing was "
              "measured (raise --memory-cap-gb, or choose --size smoke or fewer --sections)", file=sys.stderr)
        return 1
    return 0 if all(status in ("ok", "skipped") for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
