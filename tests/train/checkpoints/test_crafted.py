"""Crafted checkpoints and their messages: a file that would run code is refused without torch's advice to load it
unsafely; one without its checksum loads with a warning that it cannot be checked; non-finite weights are named as
the checkpoint's, never as "the last good checkpoint"; a step past the run's end is refused, and a finished run
resumed says it is complete."""
import os

import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint, save_checkpoint
from gradcache.train.checkpoints.checksum import CHECKSUM_KEY, content_sha256
from gradcache.train.errors import CheckpointError
from tests.train.conftest import TINY


class RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this should never run",))


def _rewrite(path, change):
    """Edit the checkpoint at `path` with `change(state)`, then sign it again, as a careful tamperer would."""
    state = torch.load(path, weights_only=True)
    change(state)
    state[CHECKSUM_KEY] = content_sha256(state)
    torch.save(state, path)


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    assert main(["train", "simclr", *TINY["simclr"], "--output-dir", str(folder)]) == 0
    return folder


def test_a_checkpoint_that_would_run_code_is_refused_without_advice_to_load_it_unsafely(tmp_path, capsys):
    path = tmp_path / "last.pt"
    torch.save({"args": {"mode": "simclr"}, "model": RunsCode()}, path)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert str(path) in message and "system" in message  # the file and what it tried to load
    assert "weights_only" not in message and "will likely succeed" not in message
    assert main(["eval", str(path)]) == errors.USAGE
    err = capsys.readouterr().err
    assert str(path) in err and "weights_only" not in err and "Traceback" not in err


def test_a_checkpoint_without_its_checksum_loads_with_a_warning(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"args": {"mode": "simclr"}, "model": {"w": torch.ones(2)}, "step": 1}, path)
    state = torch.load(path, weights_only=True)
    del state[CHECKSUM_KEY]
    torch.save(state, path)
    with pytest.warns(UserWarning, match="no checksum") as warned:
        assert load_checkpoint(path)["step"] == 1
    assert str(path) in str(warned[0].message)


def test_non_finite_weights_in_the_checkpoint_are_named_as_its_own(run, capsys):
    def poison(state):
        name = next(iter(state["model"]))
        state["model"][name] = torch.full_like(state["model"][name], float("nan"))

    _rewrite(run / "last.pt", poison)
    capsys.readouterr()
    status = main(["train", "simclr", "--resume", str(run), "--steps", "3", "--quiet"])
    err = capsys.readouterr().err
    assert status == errors.DIVERGED
    assert "last good" not in err and str(run / "last.pt") in err and "non-finite" in err


def test_a_step_past_the_runs_end_is_refused(run, capsys):
    _rewrite(run / "last.pt", lambda state: state.update(step=10))
    capsys.readouterr()
    assert main(["train", "simclr", "--resume", str(run), "--quiet"]) == errors.USAGE
    err = capsys.readouterr().err
    assert "step 10" in err and "2 steps" in err and str(run / "last.pt") in err
    assert "continuing" not in err and "Traceback" not in err


def test_resuming_a_finished_run_says_it_is_complete(run, capsys):
    capsys.readouterr()
    assert main(["train", "simclr", "--resume", str(run), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "already complete" in err and "step 2 of 2" in err and "--steps" in err
    assert f"resumed from {run / 'last.pt'} at step 2 of 2: restored the model" in err  # the file, its step, what
