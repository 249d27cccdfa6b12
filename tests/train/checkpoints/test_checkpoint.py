import os
import random

import pytest
import torch

from gradcache.train.checkpoints import atomic as checkpoint_module
from gradcache.train.checkpoints.atomic import (
    capture_random_state,
    load_checkpoint,
    restore_random_state,
    save_checkpoint,
)
from gradcache.train.errors import CheckpointError


def _state(value):
    return {"args": {"mode": "simclr"}, "model": {"w": torch.full((3,), float(value))}, "step": value}


def test_round_trip_and_run_folder(tmp_path):
    save_checkpoint(_state(1), tmp_path / "last.pt")
    for where in (tmp_path / "last.pt", tmp_path):
        loaded = load_checkpoint(where)
        assert loaded["step"] == 1 and torch.equal(loaded["model"]["w"], torch.ones(3))


def test_crash_while_saving_keeps_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    before = path.read_bytes()

    def torch_save_that_dies_halfway(state, handle):
        handle.write(b"partial bytes of a checkpoint")
        raise KeyboardInterrupt  # the process is killed in the middle of writing

    monkeypatch.setattr(checkpoint_module.torch, "save", torch_save_that_dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_state(2), path)
    assert path.read_bytes() == before
    assert load_checkpoint(path)["step"] == 1
    assert sorted(os.listdir(tmp_path)) == ["last.pt"]  # no temporary file left behind


def test_unreadable_or_foreign_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a gradcache training checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_random_state_survives_a_save_and_load(tmp_path):
    torch.manual_seed(5)
    random.seed(5)
    save_checkpoint({**_state(0), "random_state": capture_random_state()}, tmp_path / "c.pt")
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    restore_random_state(load_checkpoint(tmp_path / "c.pt")["random_state"])
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


# a save over last.pt alone renames twice (last to previous, the new file to last), over both three times
@pytest.mark.parametrize("had_previous, failing_call", [(False, 1), (False, 2), (True, 1), (True, 2), (True, 3)])
def test_a_failed_rename_leaves_last_and_previous_as_they_were(tmp_path, monkeypatch, failing_call, had_previous):
    """The renames of a save (the older previous aside, last to previous, the new file to last) fail one at a
    time: whichever fails, last.pt and previous.pt hold what they held, and nothing else is left."""
    path, previous = tmp_path / "last.pt", tmp_path / "previous.pt"
    save_checkpoint(_state(1), path, previous=previous)
    if had_previous:
        save_checkpoint(_state(2), path, previous=previous)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_replace, calls = os.replace, []

    def replace(source, target):
        calls.append((source, target))
        if len(calls) == failing_call:
            raise OSError(5, "Input/output error")  # EIO: a failing disk, not a full one
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        save_checkpoint(_state(3), path, previous=previous)
    monkeypatch.setattr(checkpoint_module.os, "replace", real_replace)
    assert len(calls) >= failing_call
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert load_checkpoint(path)["step"] == (2 if had_previous else 1)
