"""Hostile options and outputs of the benchmarks (issue 49 item 5), with the program's contract: a bad value exits 2
within its time bound with one line naming the option, before anything runs or is written; an output is replaced
whole through a temporary file in its folder, so a DIR/gpu.jsonl that is a link is replaced and the file behind it
is untouched; a run where every case was skipped says so and exits 1."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import llm_recipe
from benchmarks.atomic_output import replaced
from benchmarks.gpu import run
from benchmarks.gpu.journal import read_rows


@dataclass(frozen=True)
class OptionCase:
    """A command line of a benchmark (`argv(folder)`), the seconds it may take and the fragments of its one line."""

    name: str
    main: Callable
    argv: Callable[[Path], list[str]]
    fragments: tuple[str, ...]
    seconds: float = 10.0


def _gpu(*extra: str) -> Callable[[Path], list[str]]:
    return lambda folder: ["--device", "cpu", "--out", str(folder / "out"), *extra]


def _a_file(folder: Path) -> list[str]:
    (folder / "taken").write_text("a file the user keeps\n")
    return ["--device", "cpu", "--out", str(folder / "taken")]


def _under_a_file(folder: Path) -> list[str]:
    (folder / "taken").write_text("a file the user keeps\n")
    return ["--device", "cpu", "--out", str(folder / "taken" / "out")]


def _recipe(*extra: str) -> Callable[[Path], list[str]]:
    return lambda folder: ["--plan-only", "--output-dir", str(folder / "out"), *extra]


OPTION_CASES = [
    OptionCase("gpu-cap-nan", run.main, _gpu("--memory-cap-gb", "nan"), ("--memory-cap-gb nan", "finite")),
    OptionCase("gpu-cap-inf", run.main, _gpu("--memory-cap-gb", "inf"), ("--memory-cap-gb inf", "finite")),
    OptionCase("gpu-device-meta", run.main, lambda folder: ["--device", "meta", "--out", str(folder / "out")],
               ("--device meta",)),
    OptionCase("gpu-device-cuda-minus-1", run.main, lambda folder: ["--device", "cuda:-1", "--out", str(folder)],
               ("--device cuda:-1", "not a device")),
    OptionCase("gpu-out-a-file", run.main, _a_file, ("--out", "taken", "a file")),
    OptionCase("gpu-out-not-writable", run.main, _under_a_file, ("--out", "cannot write")),
    OptionCase("recipe-max-length", llm_recipe.main, _recipe("--max-length", "-7"), ("--max-length -7",)),
    OptionCase("recipe-lora-rank", llm_recipe.main, _recipe("--lora-rank", "-3"), ("--lora-rank -3",)),
    OptionCase("recipe-chunk-tokens", llm_recipe.main, _recipe("--chunk-tokens", "-5"), ("--chunk-tokens -5",)),
    OptionCase("recipe-vocab", llm_recipe.main, _recipe("--vocab", "2000000"), ("--vocab 2000000", "262,144")),
    OptionCase("recipe-budget-nan", llm_recipe.main, _recipe("--memory-budget-gb", "nan"),
               ("--memory-budget-gb nan", "finite")),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in OPTION_CASES])
def test_a_bad_option_exits_2_in_one_line_naming_it(case, tmp_path, capsys):
    argv = case.argv(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        case.main(argv)
    assert time.monotonic() - started < case.seconds
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert stopped.value.code == 2 and len(lines) == 1 and ": error: " in lines[0], err
    for fragment in case.fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_a_linked_journal_is_replaced_and_the_file_behind_it_is_untouched(tmp_path, capsys):
    kept = tmp_path / "elsewhere.txt"
    kept.write_text("the user's own file\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu.jsonl").symlink_to(kept)
    run.main(["--device", "cpu", "--out", str(out), "--memory-cap-gb", "0.0001", "--sections", "replay"])
    assert kept.read_text() == "the user's own file\n"
    assert not (out / "gpu.jsonl").is_symlink() and len(read_rows(out / "gpu.jsonl")) == len(
        run.build_plan(run.SIZES["smoke"], run.torch.device("cpu"), ["replay"]))
    assert [path.name for path in out.iterdir()] == ["gpu.jsonl"]  # no temporary file left


def test_a_run_where_every_case_was_skipped_says_so_and_exits_1(tmp_path, capsys):
    assert run.main(["--device", "cpu", "--out", str(tmp_path), "--memory-cap-gb", "0.0001"]) == 1
    assert "every case was skipped" in capsys.readouterr().err


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), replaced(path) as handle:
        handle.write("half of the new")
        raise RuntimeError("stopped mid-write")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["rows.csv"]
    with replaced(path) as handle:
        handle.write("new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["rows.csv"]
