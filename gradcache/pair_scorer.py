"""A cross-encoder (reranker) as a GradCache encoder: raw text pairs in, one score per pair out, tokenised chunk
by chunk inside the encoder."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.ranges import check_int
from gradcache.text_pairs import TextPairs

__all__ = ["PairScorer"]


def _logits(output: Any) -> torch.Tensor:
    """A Hugging Face sequence-classification output's `logits`, or the output itself if it is a tensor."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"the model returned {type(output).__name__} without a `logits` tensor; pass get_score=lambda output: "
            "... that picks the (B,) or (B, 1) scores out of it"
        )
    return logits


class PairScorer(nn.Module):
    """s(q, c) = model(**tokenizer(q, c)): tokenises a chunk of (query, candidate) pairs and returns its (B,) scores.

    The tokenizer runs on each chunk as GradCache reaches it (phase (1), and again in phase (3)), padded to the
    chunk's longest pair, so a batch of N (1 + k) pairs is never tokenised, nor padded, as a whole.

    Args:
        model: a cross-encoder taking the tokenizer's tensors as keyword arguments, e.g.
            `AutoModelForSequenceClassification` with `num_labels=1`; its parameters are the ones trained.
        tokenizer: a Hugging Face tokenizer, called as `tokenizer(queries, candidates, padding=True,
            truncation=True, max_length=max_length, return_tensors="pt")`.
        max_length: the tokenizer's truncation length (None: the model's maximum).
        get_score: maps the model's output to its (B,) or (B, 1) scores (default: `output.logits`).

    Raises:
        TypeError: in `forward`, a chunk that is not pairs of strings, or an output with more than one score per
            pair (a reranker has `num_labels=1`).

    Example:
        >>> scorer = PairScorer(AutoModelForSequenceClassification.from_pretrained(path, num_labels=1), tokenizer)
        >>> cache = GradCache(scorer, ListwiseRerank(), chunk_size=32, split_fn=split_pairs)
        >>> cache.step(TextPairs(pairs), group_size=1 + k)
    """

    def __init__(self, model: nn.Module, tokenizer: Callable[..., Any], *, max_length: int | None = None,
                 get_score: Callable[[Any], torch.Tensor] | None = None) -> None:
        super().__init__()
        if not callable(tokenizer):
            raise TypeError(f"tokenizer must be a callable Hugging Face tokenizer, got {type(tokenizer).__name__}")
        check_int(max_length, "max_length", optional="the model's maximum")
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.get_score = get_score if get_score is not None else _logits

    def forward(self, pairs: Sequence[Sequence[str]]) -> torch.Tensor:
        pairs = TextPairs(pairs)
        features = self.tokenizer(pairs.queries, pairs.candidates, padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt")
        device = next(self.model.parameters()).device
        scores = self.get_score(self.model(**{k: v.to(device) for k, v in features.items()}))  # (B, 1) or (B,)
        if scores.dim() == 2 and scores.shape[1] == 1:
            scores = scores.squeeze(1)
        if scores.dim() != 1:
            raise TypeError(
                f"the model gave scores of shape {tuple(scores.shape)} for {len(pairs)} pairs; a reranker gives one "
                "score per pair (num_labels=1)"
            )
        return scores  # (B,)
