"""Smoke test of benchmarks/vlm_memory.py at tiny sizes: every side's gradients checked against FullBatch (the
GradCache sides and the peer exact, accumulation not), memory points and round-robin timing written to the CSV
and PNGs, bad flags named before any work."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("PIL")

from benchmarks import vlm_memory as bench  # noqa: E402

TINY = ["--chunk", "2", "--width", "32", "--text-layers", "1", "--vision-width", "32", "--vision-blocks", "1",
        "--rounds", "1", "--threads", "1"]


def _in_process(module: str, point: dict, time_budget_s: float | None, env=None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


@pytest.mark.slow
def test_sweep_checks_exactness_and_measures_every_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    bench.main(["--sizes", "5", "--time-sizes", "5", "--check-size", "6", *TINY, "--output-dir",
                str(tmp_path / "out"), "--model-dir", str(tmp_path / "qwen2-vl")])
    header, rows = read_csv(tmp_path / "out" / "vlm_memory.csv")
    assert header == bench.COLUMNS
    assert [(row["side"], row["measure"]) for row in rows] == [
        (side, measure) for measure in ("exactness", "memory", "time") for side in bench.SIDES]
    assert all(row["status"] == "ok" for row in rows)
    checked = {row["side"]: row for row in rows if row["measure"] == "exactness"}
    for side in bench.EXACT:
        assert checked[side]["exact"] == "True" and float(checked[side]["max_relative_error"]) <= 1e-5
    assert float(checked["accumulation"]["max_relative_error"]) > 1e-3  # not a large batch: the control differs
    timed = {row["side"]: row for row in rows if row["measure"] == "time"}
    assert float(timed["st_cached"]["time_ratio_to_st"]) == 1.0
    assert (tmp_path / "out" / "vlm_memory.png").exists() and (tmp_path / "out" / "vlm_memory_time.png").exists()


def test_bad_flags_are_named_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--sides: unknown side 'peer'"):
        bench.main(["--sides", "gradcache,peer", "--output-dir", str(tmp_path)])
    assert not (tmp_path / "vlm_memory.csv").exists()


@pytest.mark.parametrize("flags, named", [(["--chunk", "0"], "--chunk must be at least 1"),
                                          (["--check-size", "16", "--chunk", "16"], "--check-size 16 is not more")])
def test_bad_sizes_exit_2_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str],
                                          named: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.main([*flags, "--output-dir", str(tmp_path)])
    assert stopped.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "vlm_memory.csv").exists()

