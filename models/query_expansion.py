"""ColBERT's query expansion, strategy "fixed" of sentence-transformers' `QueryExpansionConfig`: every query is
exactly `length` tokens, a shorter one padded and its pads replaced by the tokenizer's mask token (its EOS token
where it has no mask token), a longer one truncated; the replaced positions are scored by MaxSim
(`query_expansion_positions`) and, with `attend`, attended by the encoder too (PyLate's
`attend_to_expansion_tokens`). The tokenizer pads (`HuggingFaceTokenizer(..., expansion=...)`); `expand` swaps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gradcache.inputs import SCORED_POSITIONS  # the batch key of positions scored though not attended
from gradcache.ranges import is_int

STRATEGY = "fixed"  # the one of sentence-transformers' two strategies this program computes ("min" is refused)


@dataclass(frozen=True)
class QueryExpansion:
    """length: the tokens of every query (ColBERT and PyLate use 32), at least 2; attend: the encoder attends to
    the expansion positions (attention_mask 1 there) instead of scoring them alone.

    Raises:
        TypeError: `length` not an int, `attend` not a bool.
        ValueError: `length` below 2.
    """

    length: int
    attend: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.length):
            raise TypeError(f"length must be an int (the tokens of every query), got {self.length!r}")
        if self.length < 2:
            raise ValueError(f"length={self.length} must be at least 2 (two special tokens); ColBERT uses 32")
        if not isinstance(self.attend, bool):
            raise TypeError(f"attend must be a bool, got {self.attend!r}")

    def token_id(self, tokenizer: Any) -> int:
        """The id that fills the expansion positions: `tokenizer`'s (a transformers tokenizer) mask token, else its
        EOS token, as sentence-transformers picks it (ValueError when it has neither)."""
        for token_id in (tokenizer.mask_token_id, tokenizer.eos_token_id):
            if token_id is not None:
                return token_id
        raise ValueError(f"the tokenizer {type(tokenizer).__name__} has neither a mask token nor an EOS token to "
                         "expand queries with; train without query expansion, or save a tokenizer with a mask token")

    def expand(self, tokens: dict[str, torch.Tensor], token_id: int) -> dict[str, torch.Tensor]:
        """`tokens` (input_ids, attention_mask (B, length), padded to `length`) with every padding position
        (attention_mask 0) holding `token_id`, marked in `query_expansion_positions` (B, length) bool, and attended
        where `attend`."""
        positions = tokens["attention_mask"].eq(0)  # (B, length): the pads, whichever side the tokenizer pads
        expanded = {**tokens, "input_ids": tokens["input_ids"].masked_fill(positions, token_id),
                    SCORED_POSITIONS: positions}
        if self.attend:
            expanded["attention_mask"] = tokens["attention_mask"].masked_fill(positions, 1)
        return expanded

    def to_sentence_transformers(self) -> dict[str, Any]:
        """The Transformer module's `query_expansion` in `sentence_bert_config.json`, as sentence-transformers 6
        saves it (the default token: the mask token, else EOS)."""
        return {"strategy": STRATEGY, "attend": self.attend, "token": None, "length": self.length}

    @classmethod
    def from_sentence_transformers(cls, value: Any) -> QueryExpansion:
        """A `sentence_bert_config.json`'s `query_expansion` (`to_sentence_transformers`' form).

        Raises:
            ValueError: not a JSON object, keys sentence-transformers does not know, a strategy other than "fixed"
                (this program pads every query to one length), a token other than the default, a bad length.
        """
        if not isinstance(value, dict):
            raise ValueError(f"query_expansion {value!r} is not a JSON object such as "
                             f"{cls(32).to_sentence_transformers()}")
        unknown = sorted(set(value) - {"strategy", "attend", "token", "length"})
        if unknown:
            raise ValueError(f"query_expansion has unknown keys {unknown}; sentence-transformers reads strategy, "
                             "attend, token and length")
        if value.get("strategy") != STRATEGY:
            raise ValueError(f"query_expansion strategy {value.get('strategy')!r}: this program computes strategy "
                             f"{STRATEGY!r} alone (every query exactly `length` tokens); set it to {STRATEGY!r}")
        if value.get("token") is not None:
            raise ValueError(f"query_expansion token {value['token']!r}: this program expands with the tokenizer's "
                             "mask token (else its EOS token), the default; set token to null")
        try:
            return cls(value.get("length"), value.get("attend", False))  # type: ignore[arg-type]
        except (TypeError, ValueError) as error:
            raise ValueError(f"query_expansion {value}: {error}") from error

    def describe(self) -> str:
        """How queries are tokenised, for messages: "32 tokens, the padding replaced by mask tokens, scored, not
        attended"."""
        how = "attended and scored" if self.attend else "scored, not attended"
        return f"{self.length} tokens, the padding replaced by mask tokens, {how}"
