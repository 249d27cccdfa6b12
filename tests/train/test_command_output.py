"""stdout is a command's JSON summary alone (command_output.py): whatever else is written to stdout, by print,
by a logger made inside the command (as DeepSpeed's is, when transformers' save_pretrained imports it) or straight
to file descriptor 1, goes to stderr. The slow test runs every command in a separate process with deepspeed
installed, as a user's shell sees it."""
import json
import logging
import os
import subprocess
import sys

import pytest

from gradcache.train.command_output import print_summary, summary_on_stdout
from tests.train.conftest import TINY


def test_in_process_only_the_summary_reaches_stdout(capsys):
    with summary_on_stdout(own_process=False):
        print("[WARNING] a third party's line")
        logger = logging.getLogger("made_inside_the_command")
        logger.addHandler(logging.StreamHandler(sys.stdout))  # takes the stdout of its moment, as DeepSpeed's does
        logger.warning("Setting accelerator to CPU")
        print_summary({"steps": 2})
    logger.handlers.clear()
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"steps": 2}
    assert "a third party's line" in captured.err and "Setting accelerator" in captured.err


def test_own_process_moves_file_descriptor_1(capfd):
    with summary_on_stdout(own_process=True):
        os.write(1, b"written by C code\n")
        print("printed")
        print_summary({"rows": 3})
    os.write(1, b"after\n")  # descriptor 1 is stdout again
    captured = capfd.readouterr()
    assert captured.out.splitlines()[-1] == "after"
    assert json.loads(captured.out.rsplit("after", 1)[0]) == {"rows": 3}
    assert "written by C code" in captured.err and "printed" in captured.err


def _command(*argv, cwd=None):
    done = subprocess.run([sys.executable, "-m", "gradcache", *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


@pytest.mark.slow
def test_every_command_prints_json_alone_with_deepspeed_installed(tmp_path, tiny_bert):
    pytest.importorskip("deepspeed", reason='the dev extra installs it: pip install -e ".[dev]"')
    text_run = tmp_path / "text"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"query": f"query {i}", "positive": f"passage {i} of words",
                                        "negatives": [f"other {i}"]}) + "\n" for i in range(40)))
    summary, stderr = _command("train", "text", "--model", str(tiny_bert), *TINY["text"], "--output-dir",
                               str(text_run))
    assert summary["steps"] == 2
    for mode in ("simclr", "clip"):
        assert _command("train", mode, *TINY[mode], "--output-dir", str(tmp_path / mode))[0]["steps"] == 2
    exported, _ = _command("export", str(text_run), "--output", str(tmp_path / "exported"))
    assert exported["model"] == str(tmp_path / "exported")
    assert isinstance(_command("eval", str(text_run))[0], dict)
    encoded, _ = _command("encode", str(text_run), "--data", str(rows), "--key", "query", "--output",
                          str(tmp_path / "queries.npy"))
    assert encoded["rows"] == 40
    mined, _ = _command("mine", str(text_run), "--data", str(rows), "--negatives", "1", "--output",
                        str(tmp_path / "mined.jsonl"))
    assert mined["rows"] == 40
