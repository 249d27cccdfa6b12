"""`gradcache train vlm` on two forked gloo ranks against the same run on one process: the same losses and the same
trained weights. On the tiny Qwen2-VL folder and rows of text and PNG images (a chunk of one rank may hold images
while the other's holds none):
  - LoRA rank 4 (the adapter, RUN/model/adapter) under DeepSpeed ZeRO-2, ZeRO-3 and `--fsdp` (FSDP2: each decoder
    layer and each vision block a unit), the frozen vision tower reused on every rank;
  - `--train-vision` (every weight, RUN/model/model.safetensors) under DDP, ZeRO-3 and `--fsdp`;
  - the tiny Idefics3 under DDP, every weight but the frozen tower trained: its connector runs for images alone.
ZeRO-3 partitions every parameter (`stage3_param_persistence_threshold` 0: by default the tiny models' tensors
would all stay whole and gather nothing). Over several processes the tower runs in every forward, on a stand-in
image where a chunk holds none (`always_run_vision`), so every rank gathers and reduces the same parameters.
LoRA dropout is off: the ranks would draw other masks than one process does."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from pathlib import Path

import pytest
import torch

from gradcache.cli import main
from tests.train.vlm_rows import write_png_rows
from tests.vlm_models import tiny_idefics3, write_tiny_qwen2_vl

pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
STEPS = 3
ARGS = ["--test-size", "8", "--batch-size", "8", "--chunk-size", "2", "--steps", str(STEPS), "--warmup", "1",
        "--lr", "1e-2", "--eval-every", "0", "--checkpoint-every", "2", "--workers", "0", "--quiet", "--threads", "1"]
LORA = ("--lora-rank", "4", "--lora-dropout", "0")
# every weight trained: SGD, whose step is linear in the gradient. AdamW's divides by the gradient's own scale, and
# a key projection's bias has a gradient of 0 but for rounding (softmax ignores a shift of every score), which it
# would make a step of about the learning rate in a sign the rounding picks
FULL = ("--optimizer", "sgd")
VISION = (*FULL, "--train-vision")
# each run on two ranks: its model folder, its options and the run on one process it equals
RUNS = {
    "zero2": ("qwen2_vl", (*LORA, "--deepspeed", "zero2.json"), "one"),
    "zero3": ("qwen2_vl", (*LORA, "--deepspeed", "zero3.json"), "one"),
    "fsdp": ("qwen2_vl", (*LORA, "--fsdp"), "one"),
    "ddp_vision": ("qwen2_vl", VISION, "one_vision"),
    "zero3_vision": ("qwen2_vl", (*VISION, "--deepspeed", "zero3.json"), "one_vision"),
    "fsdp_vision": ("qwen2_vl", (*VISION, "--fsdp"), "one_vision"),
    "idefics_ddp": ("idefics3", FULL, "idefics_one"),
}
REFERENCES = {"one": ("qwen2_vl", LORA), "one_vision": ("qwen2_vl", VISION), "idefics_one": ("idefics3", FULL)}


def _argv(root: Path, name: str, folder: str, options: tuple[str, ...]) -> list[str]:
    options = [str(root / option) if option.endswith(".json") else option for option in options]
    return ["train", "vlm", "--model", str(root / folder), "--data", str(root / "rows" / "rows.jsonl"), *ARGS,
            *options, "--output-dir", str(root / name)]


def _losses(folder: Path) -> list[float]:
    with open(folder / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(1, STEPS + 1))
    return [float(row["loss"]) for row in rows]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    """What the run trained: the adapter of a LoRA run, else the whole exported model."""
    from safetensors.torch import load_file

    adapter = run / "model" / "adapter" / "adapter_model.safetensors"
    state = load_file(adapter if adapter.exists() else run / "model" / "model.safetensors")
    assert state
    return state


def on_ranks(rank: int, world_size: int, root: str) -> list[int]:
    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it; DeepSpeed reads it
    root = Path(root)
    with contextlib.redirect_stderr(io.StringIO()):
        return [main(_argv(root, name, folder, options)) for name, (folder, options, _) in RUNS.items()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The two-rank runs, then the references on one process."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.multiprocess import run_on_ranks

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    root = tmp_path_factory.mktemp("vlm_sharded")
    write_tiny_qwen2_vl(root / "qwen2_vl", padding_side="left")
    model, processor = tiny_idefics3(padding_side="left")
    model.save_pretrained(root / "idefics3")
    processor.save_pretrained(root / "idefics3")
    write_png_rows(root / "rows", 40)
    (root / "zero2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (root / "zero3.json").write_text(json.dumps({"zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0}}))
    assert run_on_ranks(on_ranks, 2, str(root)) == [[0] * len(RUNS)] * 2
    with contextlib.redirect_stderr(io.StringIO()):
        for name, (folder, options) in REFERENCES.items():
            assert main(_argv(root, name, folder, options)) == 0
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_two_ranks_train_the_weights_of_one_process(runs, name):
    one = RUNS[name][2]
    assert _losses(runs / name) == pytest.approx(_losses(runs / one), rel=1e-5)
    ours, want = _weights(runs / name), _weights(runs / one)
    assert ours.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_the_vision_runs_trained_the_tower(runs):
    """--train-vision moved every weight of the tower from the base folder's (the comparisons above would also
    hold for a tower no run trained)."""
    from safetensors.torch import load_file

    base = load_file(runs / "qwen2_vl" / "model.safetensors")
    trained = _weights(runs / "one_vision")
    tower = {key: value for key, value in trained.items() if "visual." in key}
    assert tower
    for key, value in tower.items():
        base_key = next(name for name in base if name.endswith("visual." + key.split("visual.", 1)[1]))
        assert not torch.equal(value, base[base_key]), key
