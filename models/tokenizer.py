"""A byte-level tokenizer that needs no vocabulary file: UTF-8 bytes shifted past three special tokens."""

from __future__ import annotations

import torch

from gradcache.ranges import is_int


class ByteTokenizer:
    """texts -> ``[bos] + utf8_bytes + [eos]`` ids, right-padded with ``pad`` to the longest text in the batch.

    Token ids: ``pad = 0``, ``bos = 1``, ``eos = 2``, byte ``b`` -> ``b + 3``; ``vocab_size = 259``.
    A text longer than ``context_length`` keeps its first ``context_length - 2`` bytes and still ends
    in ``eos``, so ``eos`` pooling always finds it. Batches are padded only to their longest member,
    never beyond ``context_length``.

    Args:
        context_length: the most tokens per text, ``bos`` and ``eos`` included (at least 3).

    Raises:
        ValueError: ``context_length`` below 3.

    Example:
        >>> batch = ByteTokenizer(context_length=8)(["hi", "hello world"])
        >>> batch["input_ids"].shape, batch["attention_mask"][0].tolist()
        (torch.Size([2, 8]), [1, 1, 1, 1, 0, 0, 0, 0])
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    byte_offset = 3
    vocab_size = 256 + byte_offset

    def __init__(self, context_length: int = 64) -> None:
        if not is_int(context_length, 3):
            raise ValueError(
                f"context_length={context_length!r} must be an int of at least 3 (bos, one byte, eos)."
            )
        self.context_length = context_length

    def encode(self, text: str) -> list[int]:
        """One text -> its ids, ``bos`` and ``eos`` included, truncated to ``context_length``."""
        body = [byte + self.byte_offset for byte in text.encode("utf-8")[: self.context_length - 2]]
        return [self.bos_id, *body, self.eos_id]

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """ids of one text -> the text, special tokens dropped; a multi-byte character cut by
        truncation decodes to U+FFFD rather than raising."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        data = bytes(value - self.byte_offset for value in values if value >= self.byte_offset)
        return data.decode("utf-8", errors="replace")

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """texts -> ``{"input_ids": (B, L), "attention_mask": (B, L)}`` int64 tensors, L = longest encoding."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise TypeError(
                f"texts must be a list of str, got {type(texts).__name__}; wrap a single text as [text]."
            )
        if not texts:
            raise ValueError("texts is empty; pass at least one text.")
        bad = [index for index, text in enumerate(texts) if not isinstance(text, str)]
        if bad:
            raise TypeError(f"texts must be a list of str; the items at positions {bad[:5]} are not str.")
        encoded = [self.encode(text) for text in texts]
        length = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(texts), length), self.pad_id, dtype=torch.long)  # (B, L)
        attention_mask = torch.zeros((len(texts), length), dtype=torch.long)  # (B, L)
        for row, ids in enumerate(encoded):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}
