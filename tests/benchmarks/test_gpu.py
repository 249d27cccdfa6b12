"""benchmarks.gpu, the prepared GPU run, on the CPU: every section at smoke size writes an `ok` row per case
(slow), a memory cap below every plan skips every case with its plan, a case that raises or runs out of memory
is recorded and the next one runs, and a measured peak above the plan fails its case (torch.cuda mocked)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import case as case_module
from benchmarks.gpu import run
from benchmarks.gpu.case import Case, run_case
from benchmarks.gpu.journal import read_rows

KEYS = {"section", "case", "status", "planned_peak_bytes", "measured_peak_bytes", "step_s", "max_rel_error",
        "device", "estimated_s", "error"}


def _plan(sections=None):
    return run.build_plan(run.SIZES["smoke"], torch.device("cpu"), sections or list(run.SECTIONS))


def test_a_cap_below_every_plan_skips_every_case_with_its_plan(tmp_path: Path, capsys) -> None:
    assert run.main(["--device", "cpu", "--out", str(tmp_path), "--memory-cap-gb", "0.0001"]) == 1  # none ran
    rows = read_rows(tmp_path / "gpu.jsonl")
    plan = _plan()
    assert [(r["section"], r["case"]) for r in rows] == [(c.section, c.name) for c in plan]
    assert {r["section"] for r in rows} == set(run.SECTIONS)
    assert all(KEYS <= set(r) and r["status"] == "skipped" for r in rows)
    assert [r["planned_peak_bytes"] for r in rows] == [c.planned_peak_bytes for c in plan]
    assert all(r["planned_peak_bytes"] > 0.0001 * 2**30 and "--memory-cap-gb" in r["error"] for r in rows)
    printed = capsys.readouterr().out
    assert f"plan: {len(plan)} cases, 0 within the memory cap" in printed  # the plan is printed before any case
    assert all(c.name in printed for c in plan)


@pytest.mark.slow
def test_a_case_that_raises_or_runs_out_of_memory_is_recorded_and_the_next_runs(tmp_path: Path, monkeypatch) -> None:
    written = []

    def raises(device):
        raise ValueError("a broken case")

    def out_of_memory(device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 112.00 GiB")

    def fine(device):
        written.append((tmp_path / "gpu.jsonl").read_text())  # the rows before it are on disk already
        return {"step_s": 0.5, "max_rel_error": 0.0}

    fake = [Case("replay", name, 1000, 1.0, function)
            for name, function in (("raises", raises), ("oom", out_of_memory), ("fine", fine))]
    monkeypatch.setitem(run.SECTIONS, "replay", lambda sizes, device: fake)
    assert run.main(["--device", "cpu", "--out", str(tmp_path), "--sections", "replay"]) == 1
    rows = read_rows(tmp_path / "gpu.jsonl")
    assert [(r["case"], r["status"]) for r in rows] == [("raises", "failed"), ("oom", "oom"), ("fine", "ok")]
    assert rows[0]["error"] == "ValueError: a broken case" and "112.00 GiB" in rows[1]["error"]
    assert rows[2]["step_s"] == 0.5 and rows[2]["device"] == "cpu"
    assert [json.loads(line)["case"] for line in written[0].splitlines()] == ["raises", "oom"]


def test_a_failed_check_fails_its_case() -> None:
    row = run_case(Case("replay", "x", 1000, 1.0, lambda device: {"max_rel_error": 0.5, "failure": "too far"}),
                   torch.device("cpu"))
    assert row["status"] == "failed" and row["error"] == "too far" and "failure" not in row


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's memory API as a device whose allocation at a case's start is 100 bytes and whose peak is
    `peak["bytes"]`."""
    peak = {"bytes": 0}
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak["bytes"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (7 * 2**30, 80 * 2**30))
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("peak, status", [(1100, "ok"), (1101, "failed")])
def test_a_measured_peak_above_the_plan_by_more_than_a_tenth_fails(fake_cuda, peak, status) -> None:
    fake_cuda["bytes"] = peak + 100  # above the 100 bytes allocated at the case's start
    checked = Case("memory", "x", 1000, 1.0, lambda device: {"step_s": 0.1}, check_memory=True)
    row = run_case(checked, torch.device("cuda"))
    assert row["measured_peak_bytes"] == peak and row["status"] == status
    assert status == "ok" or "measured peak" in row["error"]
    unchecked = run_case(Case("speed", "x", 1000, 1.0, lambda device: {}), torch.device("cuda"))
    assert unchecked["status"] == "ok"  # a case that does not check its plan only records the peak


def test_the_default_cap_is_the_devices_free_memory(fake_cuda) -> None:
    assert run.default_cap_bytes(torch.device("cuda")) == 7 * 2**30
    assert run.default_cap_bytes(torch.device("cpu")) > 0  # the available RAM


@pytest.mark.parametrize("argv, fragment", [(["--sections", "replay,gpu"], "--sections"),
                                            (["--memory-cap-gb", "0"], "--memory-cap-gb")])
def test_bad_arguments_exit_2_naming_the_flag(tmp_path: Path, argv, fragment, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        run.main(["--device", "cpu", "--out", str(tmp_path), *argv])
    assert stopped.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "gpu.jsonl").exists()


def test_the_gpu_plan_fits_one_80_gb_gpu_in_under_8_minutes(capsys) -> None:
    """The plan alone needs no device: every GPU-size case is planned under 80 GB (FullBatch at n = 16,384
    included), and the estimate of the whole run is under 8 minutes."""
    assert run.main(["--device", "cuda", "--plan-only"]) == 0
    plan = run.build_plan(run.SIZES["gpu"], torch.device("cuda"), list(run.SECTIONS))
    assert {c.section for c in plan} == set(run.SECTIONS)
    assert max(c.planned_peak_bytes for c in plan) < 78 * 2**30  # an H100's 80 GB, less what CUDA holds itself
    full_batch = next(c for c in plan if (c.section, c.name) == ("memory", "full_batch"))
    assert run.SIZES["gpu"].memory.n == 16384 and full_batch.check_memory
    assert sum(c.estimated_s for c in plan) < 8 * 60
    assert f"estimated {sum(c.estimated_s for c in plan):.0f} s" in capsys.readouterr().out


def test_the_planned_activations_bound_what_autograd_saves() -> None:
    """The plan's bytes per row against the bytes autograd saves for one full-length row, as the library counts
    them (each storage once), at the GPU widths: above it, with room for the backward's transients."""
    import dataclasses

    from benchmarks.gpu.towers import TokenTower, activation_bytes_per_row, make_batch
    from gradcache.graph_memory import saved_bytes

    for size in (dataclasses.replace(run.SIZES["gpu"].memory, n=2), run.SIZES["smoke"].memory):
        tower = TokenTower(size).train()
        batch = {key: torch.ones_like(value) for key, value in make_batch(size, torch.device("cpu"))[0].items()}
        with torch.enable_grad(), saved_bytes(list(tower.parameters())) as counted:
            tower(**batch)
        assert 1.3 < activation_bytes_per_row(size) / (counted.total / size.n) < 2.5


@pytest.mark.slow
def test_every_section_runs_ok_on_the_cpu_at_smoke_size(tmp_path: Path) -> None:
    """The prepared run without CUDA: every case of every section is `ok`, in the plan's order, each row with
    its plan, the device and a step time; the replayed gradients within each case's tolerance of the kept ones
    (about 18 s here)."""
    assert run.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "gpu.jsonl")
    plan = _plan()
    assert [(r["section"], r["case"]) for r in rows] == [(c.section, c.name) for c in plan]
    assert {r["section"] for r in rows} == set(run.SECTIONS)
    failed = [(r["case"], r["error"]) for r in rows if r["status"] != "ok"]
    assert not failed, failed
    assert all(KEYS <= set(r) and r["device"] == "cpu" and r["planned_peak_bytes"] > 0 for r in rows)
    timed = [r for r in rows if r["case"] != "replay_off_check_raises"]
    assert all(r["step_s"] is not None and r["step_s"] > 0 for r in timed), [r["case"] for r in timed]
    compared = {r["case"]: r["max_rel_error"] for r in rows if r["max_rel_error"] is not None}
    assert compared["replayed_vs_kept"] < 1e-2 and compared["gradcache_fp32"] < 1e-5
