"""A LoRA run's base model folder is fingerprinted when the run starts (issue 40 item 5): a resume, `gradcache eval
RUN` and `gradcache export RUN` against the folder after its weights changed (same shapes, other values) exit 2
naming the folder and the file, and the restored folder resumes; the sampled sum of a large file sees a change in
any of its blocks."""
from __future__ import annotations

import shutil

import pytest
import torch

from gradcache.cli import main
from gradcache.train.errors import UsageError
from gradcache.train.modes.base_fingerprint import BLOCK_BYTES, BLOCKS, check_fingerprint, fingerprint
from tests.train.conftest import text_args

pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
safetensors = pytest.importorskip("safetensors.torch")


def _perturb(folder) -> None:
    """Every weight of the folder's model.safetensors moved a little: the same shapes, other values."""
    path = folder / "model.safetensors"
    weights = safetensors.load_file(str(path))
    safetensors.save_file({name: w + 0.01 * torch.randn_like(w) if w.is_floating_point() else w
                           for name, w in weights.items()}, str(path), metadata={"format": "pt"})


@pytest.mark.slow
def test_a_changed_base_is_refused_by_resume_eval_and_export(tiny_bert, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(tiny_bert, base)
    run = tmp_path / "run"
    assert main(text_args(base, run, "--lora-rank", "2", "--steps", "2")) == 0
    saved = (base / "model.safetensors").read_bytes()
    _perturb(base)
    capsys.readouterr()
    commands = {"resume": ["train", "text", "--resume", str(run), "--steps", "3", "--quiet", "--workers", "0"],
                "eval": ["eval", str(run)], "export": ["export", str(run), "--output", str(tmp_path / "out")]}
    for name, argv in commands.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert "not the base model this LoRA run started from" in err and "model.safetensors (changed)" in err, name
        assert str(base) in err, name
    assert not (tmp_path / "out").exists()
    (base / "model.safetensors").write_bytes(saved)
    assert main(commands["resume"]) == 0


def test_the_sampled_sum_sees_a_change_in_any_block_and_names_missing_and_new_files(tmp_path):
    big = tmp_path / "model.safetensors"
    size = BLOCKS * BLOCK_BYTES * 3  # above the whole-file limit: sampled
    big.write_bytes(bytes(size))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not part of the model")
    recorded = fingerprint(tmp_path)
    assert set(recorded) == {"model.safetensors", "config.json"}
    for block in (0, BLOCKS // 2, BLOCKS - 1):  # first, middle and last sampled blocks
        data = bytearray(bytes(size))
        data[block * (size - BLOCK_BYTES) // (BLOCKS - 1)] = 1
        big.write_bytes(bytes(data))
        with pytest.raises(UsageError, match=r"model\.safetensors \(changed\)"):
            check_fingerprint(recorded, tmp_path, "--model")
    big.write_bytes(bytes(size))
    (tmp_path / "notes.txt").write_text("edited")
    check_fingerprint(recorded, tmp_path, "--model")  # not a model file
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    (tmp_path / "extra.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"config\.json \(changed\), extra\.bin \(new\)"):
        check_fingerprint(recorded, tmp_path, "--model")
    big.unlink()
    with pytest.raises(UsageError, match=r"model\.safetensors \(missing\)"):
        check_fingerprint(recorded, tmp_path, "--model")
