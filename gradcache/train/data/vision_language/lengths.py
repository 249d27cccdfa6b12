"""Rows too long for --max-length, refused at start from a sample rather than truncated: truncating into a row's
image tokens breaks the model (its image features no longer match its image tokens), so a row must fit whole.

The sample is the first `SAMPLE_ROWS` training rows and every held-out row (each is embedded at every
evaluation), their images opened and run through the model's processor at --max-pixels (the collator), counting
image tokens. A row whose images cannot be used is left to the loader, which counts it as bad data. The
collator refuses a longer row met later itself (a DataError naming the row: `too_long`).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput
from gradcache.train.config import RunConfig
from gradcache.train.data.images.row_images import BadRowImage
from gradcache.train.data.vision_language.opened_input import opened_row
from gradcache.train.data.vision_language.rows import VisionLanguageSplits
from gradcache.train.errors import DataError, UsageError

SAMPLE_ROWS = 64  # training rows whose lengths are checked at start
CHUNK_ROWS = 16  # rows run through the processor at once


def input_lengths(collator: VisionLanguageCollator, inputs: Sequence[VisionLanguageInput],
                  passages: bool) -> list[tuple[int, int]]:
    """(tokens, image tokens) of each input as the collator makes it (with the passage prompt when `passages`,
    else the query prompt), whatever its `max_length`."""
    unbounded = copy.copy(collator)
    unbounded.max_length = None
    batch = unbounded.passages(inputs) if passages else unbounded.queries(inputs)
    lengths = batch["attention_mask"].sum(dim=1)  # (B,)
    image_tokens = batch["input_ids"].eq(collator.image_token_id).sum(dim=1)  # (B,)
    return list(zip(lengths.tolist(), image_tokens.tolist()))


def too_long(where: str, side: str, tokens: int, image_tokens: int, max_length: int, fits: int) -> str:
    """What a row longer than --max-length is told: its name, its length, and the options that fit it."""
    return (f"{where}: its {side} holds {tokens} tokens ({image_tokens} of them image tokens), more than --max-length "
            f"{max_length}; pass --max-length {fits} (what the rows checked need), or a lower --max-pixels so its "
            "images take fewer tokens (an image is never truncated: its tokens must all be there)")


def check_vision_language_lengths(config: RunConfig, data: VisionLanguageSplits,
                                  collator: VisionLanguageCollator) -> None:
    """Refuse, before a run writes anything, a sampled row (module docstring) whose query or passage would hold
    more than --max-length tokens, image tokens included.

    Raises:
        UsageError: naming the first such row, its length, and the --max-length that fits every row checked.
    """
    rows = [*data.train[:SAMPLE_ROWS], *data.test]
    found: list[tuple[str, str, int, int]] = []  # (where, side, tokens, image tokens) of the rows too long
    longest = 0
    for start in range(0, len(rows), CHUNK_ROWS):
        queries, passages = [], []
        for row in rows[start:start + CHUNK_ROWS]:
            try:
                query, group = opened_row(row, data.image_root)
            except BadRowImage:
                continue  # bad data: counted when drawn (training), left out at start (held out)
            queries.append((row.where, "query", query))
            passages.extend((row.where, "positive" if index == 0 else f"hard negative {index}", side)
                            for index, side in enumerate(group))
        for inputs, are_passages in ((queries, False), (passages, True)):
            if not inputs:
                continue
            for (where, side, _), (tokens, image_tokens) in zip(
                    inputs, input_lengths(collator, [item for _, _, item in inputs], are_passages)):
                longest = max(longest, tokens)
                if tokens > config.max_length:
                    found.append((where, side, tokens, image_tokens))
    if found:
        where, side, tokens, image_tokens = found[0]
        more = f" ({len(found) - 1} more sides of the rows checked are too long)" if len(found) > 1 else ""
        raise UsageError(too_long(where, side, tokens, image_tokens, config.max_length, longest) + more)


def refused_length(collator: VisionLanguageCollator, wheres: Sequence[str], inputs: Sequence[VisionLanguageInput],
                   passages: bool, error: ValueError) -> DataError:
    """The DataError of a batch the collator refused (`error`): the first input longer than its max_length, named by
    its row (`wheres[i]` names input i's row); `error` itself when none is (another refusal)."""
    lengths = input_lengths(collator, inputs, passages)
    fits = max(tokens for tokens, _ in lengths)
    for where, (tokens, image_tokens) in zip(wheres, lengths):
        if collator.max_length is not None and tokens > collator.max_length:
            side = "passage" if passages else "query"
            return DataError(too_long(where, side, tokens, image_tokens, collator.max_length, fits))
    return DataError(f"the model's processor refused a batch: {error}")
