"""A tiny SPLADE model folder for the `--kind sparse` tests: the character BERT of tests/tiny_text_model.py with
its masked-LM head (random), the head's bias lowered so that rows have zeros as well as non-zeros."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_text_model import write_tiny_bert


def write_tiny_splade(folder: Path, dropout: float = 0.0, bias: float = -0.05) -> Path:
    """The tiny BERT written as a `BertForMaskedLM` (head included) with its tokenizer; returns `folder`."""
    import transformers

    write_tiny_bert(folder, dropout=dropout)
    torch.manual_seed(1)
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.add_(bias)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder)
    return folder
