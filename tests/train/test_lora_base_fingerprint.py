"""A LoRA run's base model folder is fingerprinted when the run starts (issue 40 item 5): a resume, `gradcache eval
RUN` and `gradcache export RUN` against the folder after its weights changed (same shapes, other values) exit 2
naming the folder and the file, and the restored folder resumes; the sampled sum of a large file sees a change in
any of its blocks. The tokenizer and sentence-transformers' configs are hashed whole (issue 49 item 4): two ids
swapped in tokenizer.json stop an export; `--fingerprint full` sees an edit between the sampled blocks; a run of
version 17, which recorded config.json and the weights alone, is compared on those."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from gradcache.cli import main
from gradcache.train.errors import UsageError
from gradcache.train.modes.base_fingerprint import (
    BLOCK_BYTES,
    BLOCKS,
    SETTINGS_FILES,
    check_fingerprint,
    fingerprint,
)
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


def _swap_two_ids(path) -> None:
    """tokenizer.json with the ids of two ordinary tokens exchanged: the same file size, other token ids."""
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    path.write_text(json.dumps(tokenizer))


def test_the_tokenizer_and_module_configs_are_hashed_whole(tmp_path):
    for name in SETTINGS_FILES[:4] + ("modules.json", "sentence_bert_config.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 5, "b": 6}}}))
    recorded = fingerprint(tmp_path)
    assert {"tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"} <= set(recorded)
    _swap_two_ids(tmp_path / "tokenizer.json")
    with pytest.raises(UsageError, match=r"tokenizer\.json \(changed\)"):
        check_fingerprint(recorded, tmp_path, "--model")
    _swap_two_ids(tmp_path / "tokenizer.json")
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    with pytest.raises(UsageError, match=r"1_Pooling/config\.json \(changed\)"):
        check_fingerprint(recorded, tmp_path, "--model")


def test_full_sees_an_edit_between_the_sampled_blocks_that_sampled_misses(tmp_path):
    size = BLOCKS * BLOCK_BYTES * 3
    big = tmp_path / "model.safetensors"
    big.write_bytes(bytes(size))
    sampled, full = fingerprint(tmp_path, "sampled"), fingerprint(tmp_path, "full")
    data = bytearray(size)
    between = (size - BLOCK_BYTES) // (BLOCKS - 1) + BLOCK_BYTES + 100  # after block 1 ends, before block 2
    data[between:between + 4 * 8192] = b"\x01" * (4 * 8192)  # 8,192 floats rewritten in place
    big.write_bytes(bytes(data))
    check_fingerprint(sampled, tmp_path, "--model", "sampled")  # the limit docs/training.md states
    with pytest.raises(UsageError, match=r"model\.safetensors \(changed\)"):
        check_fingerprint(full, tmp_path, "--model", "full")


def test_a_version_17_record_is_compared_on_config_and_weights_alone(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    recorded_by_17 = fingerprint(tmp_path, "weights")
    (tmp_path / "tokenizer.json").write_text("{}")  # present, never recorded: not compared
    check_fingerprint(recorded_by_17, tmp_path, "--model", "weights")
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(UsageError, match=r"model\.safetensors \(changed\)"):
        check_fingerprint(recorded_by_17, tmp_path, "--model", "weights")


@pytest.mark.slow
def test_two_ids_swapped_in_the_base_tokenizer_stop_an_export_and_full_is_recorded(tiny_bert, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(tiny_bert, base)
    run = tmp_path / "run"
    assert main(text_args(base, run, "--lora-rank", "2", "--steps", "2", "--fingerprint", "full")) == 0
    stored = torch.load(run / "last.pt", weights_only=True)["args"]
    assert stored["fingerprint"] == "full" and "tokenizer.json" in stored["base_fingerprint"]
    _swap_two_ids(base / "tokenizer.json")
    capsys.readouterr()
    assert main(["export", str(run), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json (changed)" in err and str(base) in err
    assert not (tmp_path / "out").exists()
