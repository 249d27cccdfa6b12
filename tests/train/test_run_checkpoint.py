"""One interface for both kinds of checkpoint: `open_checkpoint` finds either from a file, a folder or a run
folder (a sharded save stopped between its two renames included), and each kind saves, reads and loads alike."""
import shutil

import pytest
import torch
from torch import nn

from gradcache.losses import ClipLoss
from gradcache.train.checkpoint import CheckpointError
from gradcache.train.run_checkpoint import FileCheckpoint, ShardedCheckpoint, open_checkpoint, run_checkpoint


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
    found.check_fits(other)
    found.load(other)
    for name, value in trained.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name
    with pytest.raises(CheckpointError):
        found.check_fits(nn.ModuleDict({"model": nn.Linear(5, 3), "loss": ClipLoss(learnable=True)}))


def test_a_sharded_save_stopped_between_its_renames_is_read_from_old(tmp_path):
    trained = _trained(0)
    saved = run_checkpoint(tmp_path, sharded=True)
    saved.save(trained, torch.optim.SGD(trained.parameters(), lr=0.1), {"args": {"mode": "clip"}, "step": 3})
    shutil.move(tmp_path / "last.dcp", tmp_path / "last.dcp.old")  # the first rename done, the second not
    found = open_checkpoint(tmp_path)
    assert isinstance(found, ShardedCheckpoint) and found.path == tmp_path / "last.dcp"
    assert found.meta()["step"] == 3


def test_no_checkpoint_there(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path)
