"""Lengths that leave each text some of its own tokens: `--max-length`, `--query-expansion` and the prompts,
checked at the start of a text run (its mode's `resolve`, before anything is written) on a sample of its rows.

A text keeps none of its own tokens when its ids are those of the empty text under the same prompt, expansion and
truncation: the special tokens and the prompt fill the length, every text gets the same ids, and the run trains
on nothing. A cross-encoder's pair keeps its text when both its query and its passage keep some of theirs (its
`longest_first` truncation may cut one of them away).

- No sampled row keeps its text, at a length below the smallest that leaves one token (the special tokens, the
  prompt's tokens, and one): UsageError naming the option and that smallest length.
- Some rows lose their text (a cross-encoder's short queries beside long passages): one warning on stderr with the
  count, as sentence-transformers warns of truncation, and the run goes on.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradcache import distributed
from gradcache.models import HuggingFaceTokenizer
from gradcache.models.query_expansion import QueryExpansion
from gradcache.train.config import RunConfig
from gradcache.train.data.text.text_pairs import TextSplits
from gradcache.train.errors import UsageError
from gradcache.train.modes.text_folders import query_expansion, text_tokenizer

SAMPLE_ROWS = 64  # rows tokenised at start: their queries, and their positives and hard negatives


@dataclass(frozen=True)
class Lost:
    """Of `sampled` texts (or pairs), `lost` keep none of their own tokens at `option` (e.g. "--max-length 8");
    `smallest`: the least length that leaves one text token (two for a pair)."""

    lost: int
    sampled: int
    option: str
    length: int
    smallest: int
    what: str  # "queries", "passages", "pairs"
    because: str  # what fills the length: "its 2 special tokens and the 9 tokens of --query-prompt"


def sample_rows(data: TextSplits, count: int = SAMPLE_ROWS) -> list[tuple[str, str, list[str]]]:
    """Up to `count` rows spread over the training rows (the held-out ones where the training rows are streamed and
    cannot be read at a place)."""
    rows = data.train if hasattr(data.train, "row") else data.test
    stride = max(1, len(rows) // count)
    return [rows.row(index) for index in range(0, len(rows), stride)][:count]


def check_text_lengths(config: RunConfig, data: TextSplits) -> None:
    """The queries (after `--query-prompt`, expanded by `--query-expansion`) and the passages (after
    `--passage-prompt`) of a sample of the rows keep text at their lengths (module docstring)."""
    rows = sample_rows(data)
    if not rows:
        return
    tokenizer = text_tokenizer(config)
    expansion = query_expansion(config)
    queries = [query for query, _, _ in rows]
    passages = [passage for _, positive, negatives in rows for passage in (positive, *negatives)]
    for what, texts, prompt, prompt_option, expand in (
            ("queries", queries, config.query_prompt, "--query-prompt", expansion),
            ("passages", passages, config.passage_prompt, "--passage-prompt", None)):
        report(lost_texts(tokenizer, texts, prompt, prompt_option, expand, what))


def check_pair_lengths(config: RunConfig, data: TextSplits, tokenizer: Any) -> None:
    """The (query, positive) and (query, hard negative) pairs of a sample of the rows, tokenised together by
    `tokenizer` (the cross-encoder's own, a transformers tokenizer) at `--max-length`, keep text of both."""
    rows = sample_rows(data)
    pairs = [(query, passage) for query, positive, negatives in rows for passage in (positive, *negatives)]
    if pairs:
        report(lost_pairs(tokenizer, pairs, config.max_length))


def lost_texts(tokenizer: HuggingFaceTokenizer, texts: list[str], prompt: str | None, prompt_option: str,
               expansion: QueryExpansion | None, what: str) -> Lost:
    """How many of `texts`, tokenised as one side tokenises them, have the ids of the empty text."""
    empty = _kept(tokenizer([""], prompt=prompt, expansion=expansion), 0)
    batch = tokenizer(texts, prompt=prompt, expansion=expansion)
    lost = sum(_kept(batch, row) == empty for row in range(len(texts)))
    length, option = ((tokenizer.max_length, "--max-length") if expansion is None
                      else (expansion.length, "--query-expansion"))
    special = _special_tokens(tokenizer.tokenizer)  # its BOS / CLS and EOS / SEP
    words = 0 if prompt is None else len(tokenizer.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    because = f"its {special} special tokens" + (f" and the {words} tokens of {prompt_option}" if words else "")
    return Lost(lost, len(texts), option, length, special + words + 1, what, because)


def lost_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> Lost:
    """How many `pairs` lose their query's or their passage's every token to the truncation: no token of the
    first or of the second sequence left (a fast tokenizer's `sequence_ids`; a slow one is judged by the smallest
    length alone)."""
    special = _special_tokens(tokenizer, pair=True)
    smallest = special + 2
    batch = tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation=True, max_length=max_length)
    if max_length < smallest or getattr(batch, "encodings", None) is None:
        # Below the smallest length no pair keeps both texts (and below the special tokens transformers gives up
        # truncating, with a warning); a slow tokenizer has no sequence ids: it is judged by the length alone.
        lost = len(pairs) if max_length < smallest else 0
    else:
        lost = sum(not {0, 1} <= set(batch.sequence_ids(row)) for row in range(len(pairs)))
    return Lost(lost, len(pairs), "--max-length", max_length, smallest, "pairs", f"a pair's {special} special tokens")


def _special_tokens(tokenizer: Any, pair: bool = False) -> int:
    """The tokens `tokenizer` (a transformers tokenizer) adds to one text, or to a pair of texts."""
    texts = ("a", "b") if pair else ("a",)
    alone = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
    return len(tokenizer(*texts)["input_ids"]) - alone


def report(found: Lost) -> None:
    """Refuse a length that leaves no sampled text any of its tokens; say once how many lose theirs otherwise."""
    if not found.lost:
        return
    given = f"{found.option} {found.length}"
    own = "their query's or their passage's" if found.what == "pairs" else "their own"
    if found.lost == found.sampled and found.length < found.smallest:
        raise UsageError(f"{given} leaves none of the {found.what} any of {own} tokens: {found.because} fill it, so "
                         f"every one is encoded alike; give {found.option} at least {found.smallest}")
    if distributed.rank() == 0:
        print(f"gradcache train: {given} leaves {found.lost} of {found.sampled} sampled {found.what} none of {own} "
              f"tokens ({found.because} take {found.smallest - (2 if found.what == 'pairs' else 1)}); they are "
              f"encoded as an empty text; a larger {found.option} keeps their text", file=sys.stderr)


def _kept(tokens: dict[str, Any], row: int) -> list[int]:
    """Row `row`'s attended ids, wherever the tokenizer padded."""
    return tokens["input_ids"][row][tokens["attention_mask"][row].bool()].tolist()
