"""Hostile lengths and base models for the text kinds, beside tests/train/hostile_corpus.py and in its format
(`HostileCase`: the bad input, the status name of docs/outputs.md's table, the fragments of the one-line message).

The lengths of issue 40: a query expansion that the special tokens fill, an expansion or a `--max-length` that a
prompt fills (a decoder's too: every query the same ids), a cross-encoder's `--max-length 3` (every pair
[CLS] [SEP] [SEP]); and queries that lose their text at a sound length, which a warning counts. Each model folder
is written by the case itself (tests/tiny_*.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_cross_encoder import write_tiny_cross_encoder
from tests.tiny_decoder_model import write_tiny_decoder
from tests.train.conftest import TINY
from tests.train.hostile_corpus import HostileCase

LONG_PROMPT = "instruct: retrieve the passage that answers this question. query: "  # 50+ tokens in the tiny vocabularies
EMPTY_TEXT = "\u200b\u200b"  # zero-width spaces: not whitespace to str.strip, no token to BERT's tokenizer


def _text(folder: Path, model: Path, *extra: str) -> list[str]:
    return ["train", "text", "--model", str(model), *TINY["text"], "--output-dir", str(folder / "run"), *extra]


def expansion_of_special_tokens(folder: Path, model: Path) -> list[str]:
    return _text(folder, model, "--kind", "multi-vector", "--query-expansion", "2")


def expansion_filled_by_prompt(folder: Path, model: Path) -> list[str]:
    return _text(folder, model, "--kind", "multi-vector", "--query-expansion", "8", "--query-prompt", LONG_PROMPT)


def decoder_prompt_fills_max_length(folder: Path, model: Path) -> list[str]:
    decoder = write_tiny_decoder(folder / "decoder")
    return _text(folder, decoder, "--pooling", "last", "--query-prompt", LONG_PROMPT)


def passage_prompt_fills_max_length(folder: Path, model: Path) -> list[str]:
    return _text(folder, model, "--passage-prompt", LONG_PROMPT)


def cross_encoder_max_length_3(folder: Path, model: Path) -> list[str]:
    reranker = write_tiny_cross_encoder(folder / "reranker")
    return _text(folder, reranker, "--kind", "cross-encoder", "--max-length", "3")


def cross_encoder_max_length_4(folder: Path, model: Path) -> list[str]:
    reranker = write_tiny_cross_encoder(folder / "reranker")
    return _text(folder, reranker, "--kind", "cross-encoder", "--max-length", "4")


def some_queries_without_tokens(folder: Path, model: Path) -> list[str]:
    rows = [{"query": EMPTY_TEXT if i % 8 == 0 else f"what is item {i}", "positive": f"item {i} is a thing numbered {i}"}
            for i in range(48)]
    data = folder / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return _text(folder, model, "--data", str(data))


LENGTH_CASES = [
    HostileCase("expansion-of-special-tokens", expansion_of_special_tokens, "USAGE",
                ("--query-expansion 2", "special tokens", "at least")),
    HostileCase("expansion-filled-by-prompt", expansion_filled_by_prompt, "USAGE",
                ("--query-expansion 8", "--query-prompt", "at least")),
    HostileCase("decoder-prompt-fills-max-length", decoder_prompt_fills_max_length, "USAGE",
                ("--max-length 24", "queries", "--query-prompt", "at least")),
    HostileCase("passage-prompt-fills-max-length", passage_prompt_fills_max_length, "USAGE",
                ("--max-length 24", "passages", "--passage-prompt", "at least")),
    HostileCase("cross-encoder-max-length-3", cross_encoder_max_length_3, "USAGE",
                ("--max-length 3", "pairs", "at least")),
    HostileCase("cross-encoder-max-length-4", cross_encoder_max_length_4, "USAGE",
                ("--max-length 4", "pairs", "at least")),
    HostileCase("some-queries-without-tokens", some_queries_without_tokens, "OK",
                ("sampled queries", "--max-length 24", "none of their own")),
]
