"""A tiny cross-encoder (a one-layer BERT for sequence classification, one output label) and its character
tokenizer, written to a folder by the test itself: no download. Loads as `transformers` or as a
sentence-transformers `CrossEncoder`."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_text_model import CHARACTERS, SPECIAL

QUERIES = ["what is a cat", "how fast do dogs run", "hello", "why is the sun bright", "x y", "rain again",
           "more words here", "green tea"]
PASSAGES = ["a cat is a small feline", "dogs sprint at forty km per hour", "hi there", "the sun burns hydrogen",
            "letters", "wet weather all week", "additional text", "a hot drink from leaves", "stone arches",
            "a calm evening", "nothing at all", "foo bar", "lorem ipsum", "a cold river", "new towers", "z"]


def write_tiny_cross_encoder(folder: Path, seed: int = 0, dropout: float = 0.0, hidden_size: int = 16) -> Path:
    """Write a 1-layer BertForSequenceClassification (num_labels=1) and its WordPiece tokenizer to `folder`."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + CHARACTERS + [f"##{c}" for c in CHARACTERS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=2 * hidden_size, max_position_embeddings=128, num_labels=1,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def grouped_pairs(queries: int, group_size: int) -> list[tuple[str, str]]:
    """`queries` groups of `group_size` pairs, grouped by query: query i with passages i, i+1, ... (positive first)."""
    return [(QUERIES[i], PASSAGES[(i + j * 3) % len(PASSAGES)]) for i in range(queries) for j in range(group_size)]
