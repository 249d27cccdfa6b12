"""`gradcache export RUN [--checkpoint last|previous|FILE] [--output DIR]`, what it refuses (exit 2, nothing
written), and the permissions of what a run writes (the user's umask, last.pt included)."""
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.errors import UsageError
from gradcache.train.model_folders import model_folder_format

SIMCLR = ["--steps", "2", "--checkpoint-every", "1"]  # two saves: previous.pt holds step 1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.train.conftest import TINY

    folder = tmp_path_factory.mktemp("export") / "run"
    assert main(["train", "simclr", *TINY["simclr"], "--output-dir", str(folder), *SIMCLR]) == 0
    return folder


def _weights_equal(exported, checkpoint):
    model = load_checkpoint(checkpoint)["model"]
    weights = load_file(exported / "model.safetensors")
    assert weights.keys() == model.keys()
    return all(torch.equal(weights[key], model[key]) for key in model)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["last", "previous", "previous.pt"])
def test_export_of_any_checkpoint(run, tmp_path, checkpoint, capsys):
    path = str(run / checkpoint) if checkpoint.endswith(".pt") else checkpoint
    output = tmp_path / "exported"
    assert main(["export", str(run), "--checkpoint", path, "--output", str(output)]) == 0
    source = run / ("last.pt" if checkpoint == "last" else "previous.pt")
    assert _weights_equal(output, source)
    assert not _weights_equal(output, run / ("previous.pt" if checkpoint == "last" else "last.pt"))
    assert str(output) in capsys.readouterr().err
    assert main(["export", str(run), "--output", str(output)]) == 0  # an earlier export is replaced whole
    assert _weights_equal(output, run / "last.pt")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_the_run_folder_export_equals_gradcache_export(run, tmp_path):
    assert _weights_equal(run / "model", run / "last.pt")
    assert main(["export", str(run), "--output", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "config.json").read_text() == (run / "model" / "config.json").read_text()


def test_bad_input_exits_2_naming_the_problem_and_writes_nothing(run, tmp_path, capsys):
    output = tmp_path / "out"
    (tmp_path / "empty-run").mkdir()
    cases = [
        (["export", str(tmp_path / "empty-run"), "--output", str(output)], "holds no checkpoint"),
        (["export", str(tmp_path / "missing"), "--output", str(output)], "is not a folder"),
        (["export", str(run), "--checkpoint", str(tmp_path / "nope.pt"), "--output", str(output)], "does not exist"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err
        assert not output.exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    assert main(["export", str(run), "--output", str(tmp_path / "notes")]) == 2
    assert "not a model folder that gradcache export wrote" in capsys.readouterr().err
    assert os.listdir(tmp_path / "notes") == ["mine.txt"]
    with pytest.raises(UsageError, match="unknown kind"):
        model_folder_format(tmp_path / "notes")


def test_files_get_the_umask_permissions_not_0600(tmp_path, tiny_args):
    previous = os.umask(0o027)
    try:
        assert main(tiny_args("simclr", tmp_path / "run", "--steps", "1")) == 0
    finally:
        os.umask(previous)
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    assert mode(tmp_path / "run" / "last.pt") == mode(tmp_path / "run" / "metrics.json") == 0o640
    assert {mode(path) for path in (tmp_path / "run" / "model").iterdir()} == {0o640}
    assert mode(tmp_path / "run" / "model") == 0o750


def test_a_full_disk_during_export_exits_74_and_keeps_the_earlier_export(run, tmp_path, capsys, monkeypatch):
    import shutil

    import safetensors.torch
    from safetensors import SafetensorError

    from gradcache.train import errors

    output = tmp_path / "exported"
    assert main(["export", str(run), "--checkpoint", "previous", "--output", str(output)]) == 0
    before = {path.name: path.read_bytes() for path in output.iterdir() if path.is_file()}

    def save_on_a_full_disk(tensors, filename, metadata=None):  # what safetensors raises, a message alone
        with open(filename, "wb") as handle:
            handle.write(b"the first bytes")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    usage = shutil.disk_usage
    monkeypatch.setattr(safetensors.torch, "save_file", save_on_a_full_disk)
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: usage(path)._replace(used=usage(path).total, free=0))
    capsys.readouterr()
    status = main(["export", str(run), "--output", str(output)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert status == errors.DISK_FULL, err
    assert f"no space left to write the model folder {output}" in err and f"gradcache export {run}" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {path.name: path.read_bytes() for path in output.iterdir() if path.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
