"""Every hostile input of the corpus (tests/train/hostile_corpus.py) through the program: the status that
docs/outputs.md's exit-status table gives its name, one line naming the cause and the file or option, nothing
written outside the run folder, and nothing the user had lost."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradcache.cli import main
from tests.train.hostile_corpus import CASES

OUTPUTS = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"


def statuses() -> dict[str, int]:
    """The exit-status table of docs/outputs.md, by name; the unnamed 0 is OK."""
    table = OUTPUTS.read_text(encoding="utf-8").split("## Exit statuses", 1)[1]
    rows = re.findall(r"^\| (\d+) \| ?([A-Z_]*) ?\|", table, flags=re.MULTILINE)
    return {name or "OK": int(number) for number, name in rows if name or number == "0"}


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def test_the_table_names_every_status_the_corpus_expects():
    table = statuses()
    assert {"OK", "USAGE", "DATA_ERROR", "DISK_FULL", "PREEMPTED"} <= set(table)
    assert {case.status for case in CASES} <= set(table)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_hostile_input(case, tmp_path, tiny_bert, capsys):
    folder = tmp_path / "case"
    folder.mkdir()
    argv = case.build(folder, tiny_bert)
    run = folder / "run"
    before = _files(tmp_path)
    status = main(argv)
    err = capsys.readouterr().err
    assert status == statuses()[case.status], err
    after = _files(tmp_path)
    added_outside = [p for p in after if p not in before and not p.is_relative_to(run)]
    assert not added_outside, f"{case.name} wrote outside the run folder: {added_outside}"
    escaped = [p for p in (Path("/tmp/absolute-escape.txt"), Path.cwd().parent / "escaped.txt") if p.exists()]
    assert not escaped, f"{case.name} wrote {escaped}"
    changed = [p for p, data in before.items() if after.get(p) != data]
    assert not changed, f"{case.name} changed or removed files the user had: {changed}"
    if case.status != "OK":
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gradcache: "), err
        for fragment in case.fragments:
            assert fragment in lines[0], (fragment, lines[0])
        assert not run.exists() or {p for p in run.iterdir() if p.name != ".lock"} <= set(before), \
            f"{case.name} left a run folder behind"

