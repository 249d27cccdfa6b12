"""`gradcache train vlm --lora-rank 4` on the tiny Qwen2-VL folder and rows of text and PNG images, under
`--deepspeed` ZeRO-2 and under `--fsdp` (FSDP2: each decoder layer and vision block a unit) on two forked gloo
ranks, against the same run on one process without sharding: the same losses and the same adapter
(RUN/model/adapter), the frozen vision tower reused on every rank; ZeRO-3 on two ranks exits 2 before writing. LoRA dropout is off: the ranks would draw other
masks than one process does."""
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
from gradcache.train import errors
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


PLACEMENTS = ("zero2", "fsdp")


def sharded_on_ranks(rank: int, world_size: int, root: str) -> list[int]:
    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it; DeepSpeed reads it
    root = Path(root)
    with contextlib.redirect_stderr(io.StringIO()):
        return [main(_argv(root, "zero2", "--deepspeed", str(root / "zero2.json"))),
                main(_argv(root, "fsdp", "--fsdp")),
                main(_argv(root, "zero3", "--deepspeed", str(root / "zero3.json")))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The two-rank runs, then the reference on one process."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.multiprocess import run_on_ranks

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    root = tmp_path_factory.mktemp("vlm_sharded")
    write_tiny_qwen2_vl(root / "qwen2_vl", padding_side="left")
    write_png_rows(root / "rows", 40)
    for stage in (2, 3):
        (root / f"zero{stage}.json").write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    # ZeRO-3 would gather the vision tower's parameters on the ranks whose chunk holds an image alone: refused
    assert run_on_ranks(sharded_on_ranks, 2, str(root)) == [[0, 0, errors.UsageError.exit_status]] * 2
    assert not (root / "zero3").exists()
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(_argv(root, "one")) == 0
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", PLACEMENTS)
def test_two_ranks_train_the_adapter_of_one_process(runs, name):
    assert _losses(runs / name) == pytest.approx(_losses(runs / "one"), rel=1e-5)
    ours, reference = _adapter(runs / name), _adapter(runs / "one")
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-7, msg=key)
