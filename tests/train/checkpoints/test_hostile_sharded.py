"""A sharded checkpoint (`last.dcp`) from elsewhere runs no code and is read once (issue 49 item 1, the sharded
part): torch.distributed.checkpoint reads `.metadata` with pickle, so a `.metadata` carrying a payload (its sha256
in extra.pt recomputed, as a careful forger would) ran code on `gradcache eval` and `--resume`; it is now read by
an unpickler that builds the metadata's own classes alone. A shard named outside the folder, a link, and a shard
renamed over after the check are refused or never read. The folders are written by `save_sharded` itself in one
process (no process group), around a small linear model."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import EXTRA_FILE, read_checked, save_checkpoint
from gradcache.train.checkpoints.checksum import files_sha256
from gradcache.train.checkpoints.sharded import FILES_KEY, ScreenedShards, load_sharded_model, save_sharded
from gradcache.train.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _model() -> nn.ModuleDict:
    torch.manual_seed(0)
    return nn.ModuleDict({"model": nn.Linear(3, 2), "loss": nn.Module()})


@pytest.fixture
def folder(tmp_path) -> Path:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return save_sharded(tmp_path / "last.dcp", model, optimizer, extra={"step": 1})


def _edit_metadata(folder: Path, change) -> None:
    with open(folder / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file
    change(metadata)
    with open(folder / ".metadata", "wb") as handle:
        pickle.dump(metadata, handle)
    extra = read_checked(folder / EXTRA_FILE)
    save_checkpoint({**extra, FILES_KEY: files_sha256(folder, exclude=(EXTRA_FILE,))}, folder / EXTRA_FILE)


def test_a_payload_in_metadata_with_the_sums_recomputed_is_refused_without_running(folder, tmp_path):
    marker = tmp_path / "ran"
    _edit_metadata(folder, lambda metadata: setattr(metadata, "storage_meta", Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata is not the metadata .* refused without running"):
        ScreenedShards(folder)
    assert not marker.exists()


def test_a_shard_named_outside_the_folder_is_refused(folder, tmp_path):
    (tmp_path / "elsewhere.distcp").write_bytes((folder / "__0_0.distcp").read_bytes())

    def escape(metadata):
        for where in metadata.storage_data.values():
            where.relative_path = "../elsewhere.distcp"

    _edit_metadata(folder, escape)
    with pytest.raises(CheckpointError, match=r"names the shard '\.\./elsewhere\.distcp'"):
        ScreenedShards(folder)


def test_a_link_in_the_folder_is_refused_naming_it(folder, tmp_path):
    shard = folder / "__0_0.distcp"
    outside = tmp_path / "shared" / shard.name
    outside.parent.mkdir()
    shutil.copy(shard, outside)
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(CheckpointError, match="is a symbolic link") as refused:
        ScreenedShards(folder)
    assert str(shard) in str(refused.value)


def test_a_shard_renamed_over_after_the_check_is_never_read(folder, tmp_path):
    """The check reads every file into a private copy; the load reads the copy: zeros renamed over the shard
    after the check change nothing loaded (the reference: the model that was saved)."""
    screened = ScreenedShards(folder)
    forged = _model()
    with torch.no_grad():
        for parameter in forged.parameters():
            parameter.zero_()
    save_sharded(tmp_path / "forged.dcp", forged, torch.optim.SGD(forged.parameters(), lr=0.1), extra={"step": 1})
    os.replace(tmp_path / "forged.dcp" / "__0_0.distcp", folder / "__0_0.distcp")
    loaded = nn.ModuleDict({"model": nn.Linear(3, 2), "loss": nn.Module()})
    assert load_sharded_model(folder, loaded, screened)["step"] == 1
    for got, want in zip(loaded.parameters(), _model().parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not screened.copy.folder.exists()  # the load removed its copy
    with pytest.raises(CheckpointError, match="__0_0.distcp fails its checksum"):
        ScreenedShards(folder)  # read anew, the swapped shard is seen


@pytest.mark.slow  # a one-process --fsdp run, then two evals
def test_gradcache_eval_of_a_planted_last_dcp_falls_back_or_exits_2(tmp_path, tiny_args, capsys):
    marker = tmp_path / "ran"
    run = tmp_path / "run"
    assert main(tiny_args("simclr", run, "--fsdp", "--steps", "2", "--checkpoint-every", "1", "--eval-every", "0",
                          "--threads", "1", "--quiet")) == 0
    capsys.readouterr()
    assert main(["eval", str(run / "previous.dcp")]) == 0
    reference = json.loads(capsys.readouterr().out)
    _edit_metadata(run / "last.dcp", lambda metadata: setattr(metadata, "storage_meta", Payload(marker)))
    assert main(["eval", str(run)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == reference and "falling back to the previous one" in captured.err
    shutil.rmtree(run / "previous.dcp")
    assert main(["eval", str(run)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "last.dcp" in lines[0] and ".metadata is not the metadata" in lines[0]
    assert not marker.exists()
