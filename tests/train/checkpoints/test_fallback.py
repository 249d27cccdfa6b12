"""Checkpoints to fall back on: a damaged newest checkpoint (truncated, or with flipped bytes) falls back to the
previous one with a warning when a run folder is given and is refused (exit 2) when the file itself is given; a
full disk during a save ends the run with exit status 74, keeping the previous checkpoint; leftovers of an
interrupted save are removed at start."""
import csv
import errno
import shutil

import pytest
import torch
from torch import nn

from gradcache.cli import main
from gradcache.losses import ClipLoss
from gradcache.train import errors
from gradcache.train.checkpoints import atomic as checkpoint_module
from gradcache.train.checkpoints.atomic import load_checkpoint, save_checkpoint
from gradcache.train.checkpoints.run_checkpoint import open_checkpoint, run_checkpoint
from gradcache.train.errors import CheckpointError

STEPS = ["--steps", "4", "--checkpoint-every", "2"]


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(row["step"], row["loss"]) for row in csv.DictReader(handle)]


def _flip_a_byte_inside(path, tensor):
    """Flip one byte of `tensor`'s data where it lies in the file `path`."""
    data = bytearray(path.read_bytes())
    where = data.find(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    assert where >= 0
    data[where + 1] ^= 0x40
    path.write_bytes(bytes(data))


def test_flipped_bytes_fail_the_checksum(tmp_path):
    weight = torch.arange(64, dtype=torch.float32)
    save_checkpoint({"args": {"mode": "simclr"}, "model": {"w": weight}, "step": 1}, tmp_path / "last.pt")
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["model"]["w"], weight)
    _flip_a_byte_inside(tmp_path / "last.pt", weight)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["step"] == 1  # torch alone reads it without a word
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_checkpoint(tmp_path / "last.pt")


def test_a_damaged_shard_falls_back_to_the_previous_sharded_checkpoint(tmp_path, capsys):
    torch.manual_seed(0)
    trained = nn.ModuleDict({"model": nn.Linear(64, 8), "loss": ClipLoss(learnable=True)})
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    saved = run_checkpoint(tmp_path, sharded=True)
    for step in (1, 2):
        saved.save(trained, optimizer, {"args": {"mode": "clip"}, "step": step})
    shard = next(saved.path.glob("*.distcp"))
    _flip_a_byte_inside(shard, trained["model"].weight.detach())
    with pytest.raises(CheckpointError, match="fails its checksum"):
        open_checkpoint(saved.path)  # the folder itself: refused
    assert open_checkpoint(tmp_path).meta()["step"] == 1  # the run folder: the previous one
    assert f"the newest checkpoint {saved.path} is unusable" in capsys.readouterr().err


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_falls_back_with_a_warning_and_resumes_with_the_same_losses(
        tmp_path, tiny_args, capsys):
    run = tmp_path / "run"
    assert main(tiny_args("simclr", run, *STEPS)) == 0  # last.pt at step 4, previous.pt at step 2
    uninterrupted, final = _losses(run), load_checkpoint(run)["model"]
    assert load_checkpoint(run / "previous.pt")["step"] == 2
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])  # a copy or a disk cut it short
    (run / ".last.pt.x1y2.tmp").write_bytes(b"half a save")  # what a save killed half-way leaves
    (run / "last.dcp.partial").mkdir()
    capsys.readouterr()

    for argv in (["eval", str(run / "last.pt")], ["train", "simclr", "--resume", str(run / "last.pt")]):
        assert main(argv) == errors.USAGE  # the bad file itself: refused, not replaced
        assert "cannot read checkpoint" in capsys.readouterr().err
    assert main(["eval", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"the newest checkpoint {run / 'last.pt'} is unusable" in err and str(run / "previous.pt") in err

    assert main(["train", "simclr", "--resume", str(run), "--quiet", "--workers", "0"]) == 0
    err = capsys.readouterr().err
    assert f"the newest checkpoint {run / 'last.pt'} is unusable" in err and str(run / "previous.pt") in err
    assert _losses(run) == uninterrupted
    resumed = load_checkpoint(run)
    for name in final:
        assert torch.equal(resumed["model"][name], final[name]), name
    assert load_checkpoint(run / "previous.pt")["step"] == 2  # the one resumed from is kept as the previous
    assert (run / "last.pt.damaged").read_bytes() == data[: len(data) // 2]
    assert not (run / ".last.pt.x1y2.tmp").exists() and not (run / "last.dcp.partial").exists()


def test_a_full_disk_during_a_save_ends_the_run_and_keeps_the_previous_checkpoint(tmp_path, tiny_args, capsys,
                                                                                   monkeypatch):
    original, saves = torch.save, []

    def save_on_a_full_disk(state, handle):
        saves.append(state["step"])
        if len(saves) == 1:
            return original(state, handle)
        handle.write(b"the first bytes of a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", save_on_a_full_disk)
    status = main(tiny_args("simclr", tmp_path, *STEPS))
    monkeypatch.setattr(checkpoint_module.torch, "save", original)
    assert status == errors.DISK_FULL and saves == [2, 4]
    err = capsys.readouterr().err
    assert f"no space left to save a checkpoint in {tmp_path}" in err and "MiB free" in err
    assert f"--resume {tmp_path}" in err
    assert load_checkpoint(tmp_path)["step"] == 2
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    shutil.rmtree(tmp_path)


class _FullAfter:
    """A file whose writes fail with ENOSPC once `room` bytes are written, as a full disk's do."""

    def __init__(self, handle, room):
        self.handle, self.room = handle, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.handle.file.write(data)


def _third_save_on_a_full_disk(how, monkeypatch):
    """Let two saves through, then fail the third one as a full disk does, `how`: the file's own write fails
    and torch wraps it (`RuntimeError: ... unexpected pos`, the OSError as its context), or torch raises its
    RuntimeError with no trace of the OSError and the disk has no space left."""
    original_temporary, original_save, saves = checkpoint_module.tempfile.NamedTemporaryFile, torch.save, []

    def temporary(*args, **kwargs):
        handle = original_temporary(*args, **kwargs)
        saves.append(handle.name)
        if len(saves) == 3 and how == "write":
            handle.write = _FullAfter(handle, 100).write  # what torch.save calls
        return handle

    def save(state, handle):
        if len(saves) == 3 and how == "torch":
            handle.write(b"the first bytes of a checkpoint")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726")
        return original_save(state, handle)

    monkeypatch.setattr(checkpoint_module, "tempfile", type("Temporary", (), {"NamedTemporaryFile": temporary}))
    monkeypatch.setattr(checkpoint_module.torch, "save", save)
    if how == "torch":
        usage = shutil.disk_usage

        def no_space_left(path):
            real = usage(path)
            return real._replace(used=real.total, free=0) if len(saves) == 3 else real

        monkeypatch.setattr(errors.shutil, "disk_usage", no_space_left)
    return saves


@pytest.mark.slow
@pytest.mark.parametrize("how", ["write", "torch"])
def test_torch_wrapping_a_full_disk_ends_the_run_with_74_and_keeps_both_checkpoints(how, tmp_path, tiny_args, capsys,
                                                                                    monkeypatch):
    saves = _third_save_on_a_full_disk(how, monkeypatch)
    status = main(tiny_args("simclr", tmp_path, "--steps", "6", "--checkpoint-every", "2"))
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert status == errors.DISK_FULL and len(saves) == 3, err
    assert f"no space left to save a checkpoint in {tmp_path}" in err and f"--resume {tmp_path}" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert load_checkpoint(tmp_path)["step"] == 4 and load_checkpoint(tmp_path / "previous.pt")["step"] == 2
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_save_with_space_left_is_not_called_a_full_disk(tmp_path, monkeypatch):
    def broken(state, handle):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726")

    monkeypatch.setattr(checkpoint_module.torch, "save", broken)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        save_checkpoint({"step": 1}, tmp_path / "last.pt")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["shards", "extra.pt"])
def test_a_full_disk_during_a_sharded_save_names_the_size_of_what_it_saves(where, tmp_path, monkeypatch):
    """Not the 0.0 MiB of an extra.pt, nor of a folder not yet there: the bytes of the state being saved; and a
    first save's failure says that the run has no checkpoint yet, a later one's that the last one is kept."""
    from gradcache.train.checkpoints import sharded

    model = nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, exp_avg, exp_avg_sq
    original_save, original_extra = sharded.dcp.save, sharded.save_checkpoint

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for attempt, resumable in ((1, False), (2, True)):
        monkeypatch.setattr(sharded.dcp if where == "shards" else sharded,
                            "save" if where == "shards" else "save_checkpoint", full)
        with pytest.raises(errors.DiskFull) as raised:
            sharded.save_sharded(tmp_path / "last.dcp", model, optimizer, {"step": attempt},
                                 previous=tmp_path / "previous.dcp")
        assert raised.value.needed_bytes >= state_bytes
        message = str(raised.value)
        assert ("the checkpoints already there are kept" in message) is resumable, message
        assert ("the run had no checkpoint yet" in message) is not resumable and "0.0 MiB" not in message
        assert not (tmp_path / "last.dcp.partial").exists()
        monkeypatch.setattr(sharded.dcp, "save", original_save)
        monkeypatch.setattr(sharded, "save_checkpoint", original_extra)
        sharded.save_sharded(tmp_path / "last.dcp", model, optimizer, {"step": attempt},
                             previous=tmp_path / "previous.dcp")
