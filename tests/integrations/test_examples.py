"""Each example in examples/ runs end to end on a tiny model and a few steps, and its loss is finite."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_huggingface_trainer_example(tmp_path):
    pytest.importorskip("accelerate")
    loss = load("huggingface_trainer").main(
        ["--steps", "2", "--batch-size", "16", "--chunk-size", "5", "--accumulation", "2", "--output-dir", str(tmp_path)])
    assert math.isfinite(loss)


def test_lightning_example():
    pytest.importorskip("lightning")
    loss = load("lightning_module").main(["--steps", "2", "--batch-size", "16", "--chunk-size", "5",
                                          "--precision", "bf16-mixed"])
    assert math.isfinite(loss)


def test_sentence_transformers_example(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("datasets")
    from tests.integrations.sentence_models import save_tiny_bert

    loss = load("sentence_transformers_loss").main(
        ["--model", str(save_tiny_bert(tmp_path / "bert")), "--steps", "2", "--batch-size", "6", "--chunk-size", "4"])
    assert math.isfinite(loss)
