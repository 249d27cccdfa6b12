"""The hostile data, environment and --deepspeed values of issue 49 through the program
(tests/train/hostile_data_corpus.py): each ends within its time bound with the status docs/outputs.md's table gives
its name; a refusal is one error line naming the variable, key or file, never a traceback; a run that meets a bad
image skips it, names it in a warning and counts it."""
from __future__ import annotations

import json
import time

import pytest

from gradcache.cli import main
from tests.train.hostile_data_corpus import DATA_CASES
from tests.train.test_hostile_corpus import statuses

LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in DATA_CASES])
def test_hostile_data(case, tmp_path, monkeypatch, capsys, recwarn):
    if "deepspeed" in case.name:
        pytest.importorskip("deepspeed", reason='the dev extra installs it: pip install -e ".[dev]"')
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    folder = tmp_path / "case"
    folder.mkdir()
    argv = case.build(folder)
    started = time.monotonic()
    status = main(argv)
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == statuses()[case.status], err
    assert seconds < case.seconds, f"{case.name} took {seconds:.0f} s"
    assert "Traceback" not in err
    if case.status == "OK":  # the warnings naming the file: on stderr, or in pytest's record where it keeps them
        said = err + "\n".join(str(warning.message) for warning in recwarn)
        for fragment in case.fragments:
            assert fragment in said, (fragment, said)
        skipped = json.loads((folder / "run" / "metrics.json").read_text())["skipped_images"]
        assert skipped >= 1
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gradcache: "), err
        for fragment in case.fragments:
            assert fragment in lines[0], (fragment, lines[0])
        assert not (folder / "run").exists() or not any((folder / "run").iterdir())
