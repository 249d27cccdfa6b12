"""`gradcache train vlm`: its options refused by name before anything is written, its model folders told apart
from text's, LoRA on the language model alone (never the vision tower nor its merger), the frozen tower handed to
the strategy for reuse, FSDP2's units, and the held-out retrieval against a brute-force ranking; end to end
(slow): the default run at a tiny size writes its metrics and their `_random_init` twins, and a resume after a
kill continues with the same losses."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache.cli import main  # noqa: E402
from gradcache.train import errors  # noqa: E402
from gradcache.train.config import RunConfig  # noqa: E402
from gradcache.train.model_folders import model_folder_format  # noqa: E402
from gradcache.train.modes import MODES, folder_reader  # noqa: E402
from gradcache.train.modes.lora import lora_settings  # noqa: E402
from gradcache.train.modes.vision_language import VisionLanguage, lora_targets  # noqa: E402
from tests.vlm_models import tiny_idefics3, tiny_qwen2_vl, write_tiny_qwen2_vl  # noqa: E402

# the default run at a tiny size: the preset on the built-in shapes, a few steps
TINY_VLM = ["--train-size", "64", "--test-size", "16", "--batch-size", "8", "--chunk-size", "4", "--warmup", "1",
            "--quiet", "--workers", "0", "--threads", "1", "--eval-every", "0"]
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    return write_tiny_qwen2_vl(tmp_path_factory.mktemp("vlm") / "qwen2_vl", padding_side="left")


def _fails(argv: list[str], capsys, *fragments: str) -> None:
    assert main(argv) == errors.UsageError.exit_status
    message = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in message, message


def test_the_mode_is_registered_under_its_name():
    assert isinstance(MODES["vlm"], VisionLanguage)


@pytest.mark.parametrize("extra, fragments", [
    (["--lora-alpha", "4"], ["--lora-alpha", "--lora-rank"]),
    (["--lora-rank", "4", "--train-vision"], ["--train-vision", "--lora-rank 4"]),
    (["--query-prompt", "  "], ["--query-prompt", "is empty"]),
    (["--model", "no-such-preset"], ["--model no-such-preset", "tiny-qwen2-vl"]),
    (["--lora-rank", "4", "--lora-targets", "qkv"], ["--lora-targets qkv", "language model"]),
])
def test_bad_options_exit_2_naming_them_and_write_nothing(tmp_path, capsys, extra, fragments):
    """`qkv` is a leaf of the vision tower alone: LoRA never adapts it."""
    _fails(["train", "vlm", *TINY_VLM, "--steps", "1", "--output-dir", str(tmp_path / "run"), *extra], capsys,
           *fragments)
    assert not (tmp_path / "run").exists()


def test_a_text_model_folder_is_refused_naming_the_families(tmp_path, tiny_bert, capsys):
    _fails(["train", "vlm", *TINY_VLM, "--model", str(tiny_bert), "--output-dir", str(tmp_path / "run")], capsys,
           f"--model {tiny_bert}", "'bert'", "Qwen2-VL", "Idefics3")


def test_a_vlm_folder_without_its_processor_is_refused(tmp_path, capsys):
    model, _ = tiny_qwen2_vl()
    model.save_pretrained(tmp_path / "bare")
    _fails(["train", "vlm", *TINY_VLM, "--model", str(tmp_path / "bare"), "--output-dir", str(tmp_path / "run")],
           capsys, "holds no processor", "save_pretrained")


def test_a_vlm_folder_is_read_by_the_vlm_mode_and_a_text_folder_by_text(qwen_folder, tiny_bert):
    assert folder_reader(model_folder_format(qwen_folder), qwen_folder) is MODES["vlm"]
    assert folder_reader(model_folder_format(tiny_bert), tiny_bert) is MODES["text"]


def _encoder(build, **options):
    from gradcache.models import VisionLanguageEncoder

    model, _ = build()
    return VisionLanguageEncoder(model, **options)


@pytest.mark.parametrize("build, language, leaves", [
    (tiny_qwen2_vl, "language_model", {"q_proj", "v_proj"}),  # qwen2_vl_text: peft's default for qwen2
    (tiny_idefics3, "text_model", {"q_proj", "v_proj"}),  # llama: peft's default
])
def test_lora_adapts_the_language_model_alone(build, language, leaves):
    """peft's default leaves for the language model's type, every one of them inside the language model; with
    LoRA built, only adapter weights learn and none sits in the vision tower or its connector."""
    mode = MODES["vlm"]
    config = RunConfig(mode="vlm", lora_rank=2)
    encoder = _encoder(build)
    names = lora_targets(encoder, lora_settings(config))
    assert names and all(f"{language}." in name for name in names)
    assert {name.rsplit(".", 1)[-1] for name in names} == leaves
    expected = {name for name, module in encoder.model.named_modules() if isinstance(module, torch.nn.Linear)
                and f"{language}." in name and name.rsplit(".", 1)[-1] in leaves}
    assert set(names) == expected
    from gradcache.train.modes.lora import wrap_lora

    encoder.model = wrap_lora(encoder.model, lora_settings(config), names)
    trained = [name for name, p in encoder.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name and f"{language}." in name for name in trained)
    assert not any(p.requires_grad for p in encoder.vision_tower.parameters())
    assert mode.reused_modules(config, encoder) == [encoder.vision_tower]


def test_every_linear_layer_of_the_language_model_when_peft_has_no_default(monkeypatch):
    import gradcache.train.modes.vision_language as vision_language

    monkeypatch.setattr(vision_language, "peft_default_targets", lambda model_type: None)
    encoder = _encoder(tiny_qwen2_vl)
    names = lora_targets(encoder, lora_settings(RunConfig(mode="vlm", lora_rank=2)))
    linears = {name for name, module in encoder.model.named_modules() if isinstance(module, torch.nn.Linear)}
    assert set(names) == {name for name in linears if name.startswith("language_model.")}
    assert any(name.startswith("visual.") for name in linears)  # there were others to leave out


def test_train_vision_leaves_the_tower_trainable_and_reuses_nothing():
    config = RunConfig(mode="vlm", train_vision=True)
    encoder = _encoder(tiny_qwen2_vl, train_vision=True)
    assert all(p.requires_grad for p in encoder.vision_tower.parameters())
    assert MODES["vlm"].reused_modules(config, encoder) == []
    assert MODES["text"].reused_modules(config, encoder) == []  # the other modes reuse nothing


def test_fsdp_shards_each_decoder_layer_and_each_vision_block():
    from gradcache.train.parallel.fsdp import _outermost_blocks, is_block

    encoder = _encoder(tiny_qwen2_vl)
    units = {id(module) for module in _outermost_blocks(encoder, is_block)}
    assert all(id(layer) in units for layer in encoder.language_model.layers)
    assert all(id(block) in units for block in encoder.vision_tower.blocks)


def _run_metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _losses(folder: Path) -> list[str]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_the_default_run_at_a_tiny_size_writes_both_directions_and_their_random_init_twins(tmp_path):
    assert main(["train", "vlm", *TINY_VLM, "--steps", "2", "--output-dir", str(tmp_path)]) == 0
    written = _run_metrics(tmp_path)
    for direction in ("query_to_positive", "positive_to_query"):
        for metric in METRICS:
            key = f"{direction}_{metric}"
            assert 0.0 <= written[key] <= 100.0 and 0.0 <= written[f"{key}_random_init"] <= 100.0, key
    assert (tmp_path / "model" / "modules.json").is_file()


@pytest.mark.slow
def test_a_resume_after_a_kill_continues_with_the_same_losses(tmp_path, killed_after_step):
    """4 steps at once, and 4 steps killed after step 3 (the checkpoint of step 2) then resumed: the same losses
    and the same trained weights (the frozen tower rebuilt from the preset's seed)."""
    from gradcache.train.checkpoints.atomic import load_checkpoint

    argv = ["train", "vlm", *TINY_VLM, "--steps", "4", "--checkpoint-every", "2"]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    killed_after_step(3, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    assert main(["train", "vlm", "--resume", str(tmp_path / "cut"), "--quiet", "--threads", "1"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / name)["model"] for name in ("whole", "cut"))
    assert whole.keys() == resumed.keys() and not any(key.startswith("model.visual.") for key in whole)
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
