"""`--resume auto`: one command that starts a run in --output-dir, continues it from its newest good checkpoint,
or starts it afresh where it died before its first save; under torchrun it is what restarts after a worker dies
(tests/train/parallel/test_torchrun.py)."""
import csv

import pytest

from gradcache.cli import main
from gradcache.train import errors


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(row["step"], row["loss"]) for row in csv.DictReader(handle)]


def test_resume_auto_needs_an_output_dir(capsys):
    assert main(["train", "simclr", "--resume", "auto"]) == errors.USAGE
    assert "--resume auto resumes the run in --output-dir, or starts it there: give --output-dir" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_resume_auto_starts_continues_and_restarts(tmp_path, tiny_args, killed_after_step, capsys):
    auto = ["--steps", "4", "--resume", "auto"]
    assert main(tiny_args("simclr", tmp_path / "fresh", *auto, "--checkpoint-every", "2")) == 0  # an empty folder
    uninterrupted = _losses(tmp_path / "fresh")
    assert [step for step, _ in uninterrupted] == ["1", "2", "3", "4"]

    # killed after step 3 with the checkpoint of step 2: continued from it
    killed_after_step(3, tiny_args("simclr", tmp_path / "saved", *auto, "--checkpoint-every", "2"))
    assert main(tiny_args("simclr", tmp_path / "saved", *auto, "--checkpoint-every", "2")) == 0
    assert _losses(tmp_path / "saved") == uninterrupted

    # killed after step 3 before any checkpoint: neither a new run nor --resume FOLDER takes it, --resume auto
    # starts it afresh and replaces its logs
    never = tmp_path / "never"
    killed_after_step(3, tiny_args("simclr", never, *auto, "--checkpoint-every", "10"))
    assert [step for step, _ in _losses(never)] == ["1", "2", "3"] and not (never / "last.pt").exists()
    capsys.readouterr()
    assert main(tiny_args("simclr", never, "--steps", "4")) == errors.USAGE
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "simclr", "--resume", str(never)]) == errors.USAGE
    assert f"--resume auto --output-dir {never}" in capsys.readouterr().err
    assert main(tiny_args("simclr", never, *auto, "--checkpoint-every", "10")) == 0
    assert _losses(never) == uninterrupted
