"""`gradcache train vlm --lora-rank 4` on the tiny Qwen2-VL folder and rows of text and PNG images, under
`--deepspeed` ZeRO-2 on two forked gloo ranks, against the same run on one process without sharding: the same
losses and the same adapter (RUN/model/adapter), the frozen vision tower reused on every rank. LoRA dropout is
off: the ranks would draw other masks than one process does."""
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
from tests.vlm_models import write_tiny_qwen2_vl

pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
STEPS = 3
ARGS = ["--lora-rank", "4", "--lora-dropout", "0", "--test-size", "8", "--batch-size", "8", "--chunk-size", "2",
        "--steps", str(STEPS), "--warmup", "1", "--lr", "1e-2", "--eval-every", "0", "--checkpoint-every", "2",
        "--workers", "0", "--quiet", "--threads", "1"]


def _argv(root: Path, name: str, *extra: str) -> list[str]:
    return ["train", "vlm", "--model", str(root / "qwen2_vl"), "--data", str(root / "rows" / "rows.jsonl"), *ARGS,
            "--output-dir", str(root / name), *extra]


def _losses(folder: Path) -> list[float]:
    with open(folder / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(1, STEPS + 1))
    return [float(row["loss"]) for row in rows]


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = load_file(run / "model" / "adapter" / "adapter_model.safetensors")
    assert state and all("lora_" in name for name in state)
    return state


def zero2_on_ranks(rank: int, world_size: int, root: str) -> int:
    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it; DeepSpeed reads it
    root = Path(root)
    with contextlib.redirect_stderr(io.StringIO()):
        return main(_argv(root, "zero2", "--deepspeed", str(root / "zero2.json")))


@pytest.mark.slow
def test_deepspeed_zero2_on_two_ranks_trains_the_adapter_of_one_process(tmp_path):
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.multiprocess import run_on_ranks

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    write_tiny_qwen2_vl(tmp_path / "qwen2_vl", padding_side="left")
    write_png_rows(tmp_path / "rows", 40)
    (tmp_path / "zero2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert run_on_ranks(zero2_on_ranks, 2, str(tmp_path)) == [0, 0]
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(_argv(tmp_path, "one")) == 0
    assert _losses(tmp_path / "zero2") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5)
    ours, reference = _adapter(tmp_path / "zero2"), _adapter(tmp_path / "one")
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-7, msg=key)
