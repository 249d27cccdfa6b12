"""Section `program`: `gradcache train` for a few steps on the device, in this process (`gradcache.cli.main`):
clip with bf16, text with each `--kind` (docs/kinds.md) on a BERT written here, a Llama with LoRA under
DeepSpeed ZeRO-2 in one process, bf16, and `gradcache train vlm` on a random Qwen2-VL of the `vlm` section's shape
(Qwen2-VL-2B's on the GPU) with LoRA, its frozen tower reused, under DeepSpeed ZeRO-2 in one process, bf16. A case
is `ok` when the run exits 0 with its log of every step.
Sizes: the program tests' tiny runs, `program_scale` times the batch and data; the vlm case: the `vlm` section's
rows and chunks."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.case import Case
from benchmarks.gpu.model_folders import write_bert, write_llama, write_qwen2_vl, write_vlm_rows
from benchmarks.gpu.sizes import Sizes, VlmSize
from benchmarks.gpu.vlm import plan_bytes as vlm_plan_bytes

STEPS = 3
KINDS = {"dense": [], "multi-vector": ["--token-dim", "8"], "sparse": [],
         "cross-encoder": ["--negatives-per-query", "1"]}
ESTIMATED_S = {"cuda": 20.0, "cpu": 10.0}  # a run's set-up (models, data, evaluation) dominates its steps
VLM_SETUP_S = {"cuda": 60.0, "cpu": 10.0}  # the 2B model drawn on the CPU, written and read back
PLAN_BYTES = 2 * 2**30  # tiny models and batches: weights, optimizer and activations are megabytes; CUDA's context


def _common() -> list[str]:
    return ["--steps", str(STEPS), "--warmup", "1", "--quiet", "--eval-every", "0", "--checkpoint-every", str(STEPS)]


def clip_args(scale: int) -> list[str]:
    return ["train", "clip", "--train-size", str(64 * scale), "--test-size", "32", "--image-size", "16",
            "--batch-size", str(16 * scale), "--chunk-size", "8", "--width", "8", "--projection-dim", "16",
            "--text-width", "16", "--text-layers", "1", "--text-heads", "2", "--workers", "0", "--precision", "bf16",
            *_common()]


def text_args(model: Path, scale: int) -> list[str]:
    return ["train", "text", "--model", str(model), "--train-size", str(32 * scale), "--test-size", "16",
            "--batch-size", str(8 * scale), "--chunk-size", "4", "--max-length", "24", "--lr", "1e-3", *_common()]


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    seconds, scale = ESTIMATED_S[device.type], sizes.program_scale
    found = [Case("program", "clip_bf16", PLAN_BYTES, seconds, _train(lambda root: clip_args(scale)))]
    for kind, extra in KINDS.items():
        def argv(root: Path, kind: str = kind, extra: list[str] = extra) -> list[str]:
            model = write_bert(root / "bert", hidden=16 * scale, layers=2, masked_lm=kind == "sparse")
            return [*text_args(model, scale), "--kind", kind, *extra]
        found.append(Case("program", f"text_{kind}", PLAN_BYTES, seconds, _train(argv)))
    found.append(Case("program", "lora_deepspeed_zero2_bf16", PLAN_BYTES, 2 * seconds, _train(_lora_deepspeed(scale))))
    found.append(Case("program", "vlm_lora_deepspeed_zero2_bf16", vlm_plan_bytes(sizes.vlm, True) + PLAN_BYTES,
                      VLM_SETUP_S[device.type] + seconds, _train(_vlm(sizes.vlm))))
    return found


def _vlm(size: VlmSize) -> Callable[[Path], list[str]]:
    """`gradcache train vlm` on the Qwen2-VL of `size` and rows of text and images: LoRA on the language model,
    the tower frozen (reused), DeepSpeed ZeRO-2 in one process, bf16."""
    def argv(root: Path) -> list[str]:
        model = write_qwen2_vl(root / "qwen2_vl", size)
        test = max(4, size.n // 4)
        rows = write_vlm_rows(root / "rows", size.n + test, size.image_side)
        config = root / "zero2.json"
        config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
        tokens = 2 * ((size.image_side // 14) ** 2 // 4 + 2) + 16  # two images' tokens and a caption, at most
        return ["train", "vlm", "--model", str(model), "--data", str(rows), "--test-size", str(test),
                "--batch-size", str(size.n), "--chunk-size", str(size.chunk), "--chunk-tokens", str(size.chunk_tokens),
                "--max-length", str(tokens), "--lora-rank", str(size.rank), "--grad-checkpointing",
                "--deepspeed", str(config), "--precision", "bf16", "--workers", "0", "--lr", "1e-4", *_common()]
    return argv


def _lora_deepspeed(scale: int) -> Callable[[Path], list[str]]:
    def argv(root: Path) -> list[str]:
        model = write_llama(root / "llama", hidden=32 * scale, layers=2)
        config = root / "zero2.json"
        config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
        return [*text_args(model, scale), "--pooling", "last", "--query-prompt", "query: ", "--lora-rank", "4",
                "--deepspeed", str(config), "--precision", "bf16"]
    return argv


def _train(argv_of: Callable[[Path], list[str]]) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        from gradcache.cli import main

        with tempfile.TemporaryDirectory(prefix="benchmarks-gpu-") as folder:
            root = Path(folder)
            argv = [*argv_of(root), "--device", str(device), "--output-dir", str(root / "run")]
            messages = io.StringIO()
            with contextlib.redirect_stderr(messages):
                status = main(argv)
            sys.stderr.write(messages.getvalue())
            if status != 0:
                last = messages.getvalue().strip().splitlines()[-1:] or [""]
                return {"exit_status": status, "failure": f"gradcache train exited {status}: {last[0][:300]}"}
            with open(root / "run" / "train_log.csv", newline="") as handle:
                log = list(csv.DictReader(handle))
            if len(log) != STEPS:
                return {"exit_status": 0, "failure": f"train_log.csv holds {len(log)} steps, not {STEPS}"}
            elapsed = [float(row["elapsed_s"]) for row in log]  # the run's clock at each step's end
            return {"exit_status": 0, "step_s": elapsed[-1] - elapsed[-2], "loss": float(log[-1]["loss"])}
    return run
