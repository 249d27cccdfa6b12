"""One interface for both kinds of checkpoint: `open_checkpoint` finds either from a file, a folder or a run
folder (a sharded save stopped between its two renames included), and each kind saves, reads and loads alike."""
import shutil

import pytest
import torch
from torch import nn

from gradcache.losses import ClipLoss
from gradcache.train.checkpoints.run_checkpoint import (
    FileCheckpoint,
    ShardedCheckpoint,
    open_checkpoint,
    run_checkpoint,
)
from gradcache.train.errors import CheckpointError


def _trained(seed: int) -> nn.ModuleDict:
    torch.manual_seed(seed)
    return nn.ModuleDict({"model": nn.Linear(4, 3), "loss": ClipLoss(learnable=True)})


@pytest.mark.parametrize("sharded", [False, True])
def test_save_then_open_from_the_run_folder(tmp_path, sharded):
    trained = _trained(0)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=0.1)
    saved = run_checkpoint(tmp_path, sharded)
    saved.save(trained, optimizer, {"args": {"mode": "clip"}, "step": 7})
    for where in (tmp_path, saved.path):
        found = open_checkpoint(where)
        assert type(found) is (ShardedCheckpoint if sharded else FileCheckpoint) and found.path == saved.path
        assert found.meta()["step"] == 7 and found.meta()["args"] == {"mode": "clip"}
    other = _trained(1)
    found.load(other)
    for name, value in trained.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name
    wider = nn.ModuleDict({"model": nn.Linear(5, 3), "loss": ClipLoss(learnable=True)})
    untouched = {name: value.clone() for name, value in wider.state_dict().items()}
    with pytest.raises(CheckpointError, match="another model"):
        found.load(wider)
    for name, value in untouched.items():  # refused before any tensor is copied (the bias would have fit)
        assert torch.equal(wider.state_dict()[name], value), name


@pytest.mark.parametrize("sharded", [False, True])
def test_each_save_keeps_the_one_before_and_a_stop_between_the_renames_reads_it(tmp_path, sharded, capsys):
    trained = _trained(0)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    saved = run_checkpoint(tmp_path, sharded)
    for step in (3, 4):
        saved.save(trained, optimizer, {"args": {"mode": "clip"}, "step": step})
    assert open_checkpoint(saved.previous_path).meta()["step"] == 3
    assert open_checkpoint(tmp_path).meta()["step"] == 4 and capsys.readouterr().err == ""
    shutil.rmtree(saved.path) if sharded else saved.path.unlink()  # the first rename done, the second not
    found = open_checkpoint(tmp_path)
    assert found.path == saved.previous_path and found.meta()["step"] == 3
    assert f"{saved.path} is unusable (it is missing" in capsys.readouterr().err


def test_no_checkpoint_there(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="holds no checkpoint .* --resume auto"):
        open_checkpoint(tmp_path)
