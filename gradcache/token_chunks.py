"""Chunks by token budget: the examples of a mapping input sorted by length, cut where a chunk would hold more
than `chunk_tokens` tokens (rows x the chunk's own padded length, plus the vision patches of its rows' images)
or more than `chunk_size` rows.

Fixed-size chunks carry the padding of their longest row; sorted chunks hold rows of like length, so each is
trimmed to little padding and long rows share a chunk with few others. The chunks are copies in sorted
order; `order[j]` is the caller's index of sorted row j, so `embeddings[order] = sorted_embeddings`. A list or
tuple of one entry per example (labels, strings) is reordered with the rows; other values reach every chunk whole.
A row's length counts the positions it attends to or scores (`inputs.kept_positions`), as trimming keeps them:
up to its last one, and from its first where leading padding is trimmed too (`leading`), so a left-padded batch
is measured by its mask. A VLM batch's rows take their images, patches and tiles with them
(`vision_inputs.take`), and each row's vision patches (`VisionLayout.patches`) count beside its tokens: the
vision tower holds them as the language model holds the tokens.
Token embeddings come back in the sorted order and are put back, values and mask, by the same `order`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradcache.inputs import kept_positions, per_example, trim_padding
from gradcache.vision_inputs import VisionLayout, take


def has_token_mask(value: Any) -> bool:
    """Whether `chunk_tokens` applies to an input: a mapping holding a 2-D `attention_mask`."""
    return isinstance(value, Mapping) and isinstance(value.get("attention_mask"), torch.Tensor) and (
        value["attention_mask"].dim() == 2
    )


def padded_lengths(mask: torch.Tensor, leading: bool = False) -> torch.Tensor:
    """Each row's length up to its last non-padding position, from its first with `leading` (else from 0), at
    least 1: (B, L) -> (B,)."""
    mask = mask.ne(0)
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    end = (mask * positions).amax(dim=1)
    if leading:  # the first kept position, counted from 1; a row with none starts at its end
        start = torch.where(mask, positions, mask.shape[1] + 1).amin(dim=1).clamp_max(end.clamp_min(1))
        return (end - start + 1).clamp_min(1)
    return end.clamp_min(1)


def token_plan(value: Mapping[str, Any], chunk_tokens: int, chunk_size: int, layout: VisionLayout | None = None,
               leading: bool = False) -> tuple[torch.Tensor, list[int]]:
    """`order` (sorted row -> caller's row, longest first) and the rows of each chunk over that order: a chunk
    takes rows while rows x its longest row + their vision patches fit in `chunk_tokens` (at least one row)."""
    lengths = padded_lengths(kept_positions(value), leading)  # scored expansion positions count as tokens
    order = torch.sort(lengths, descending=True, stable=True).indices
    sorted_lengths = lengths[order].tolist()
    patches = [layout.patches[r] for r in order.tolist()] if layout is not None and layout.patches else None
    sizes, start = [], 0
    while start < len(sorted_lengths):
        longest = sorted_lengths[start]  # descending: the first row sets the chunk's padded length
        rows, held = 1, patches[start] if patches else 0
        while rows < min(chunk_size, len(sorted_lengths) - start):
            more = patches[start + rows] if patches else 0
            if (rows + 1) * longest + held + more > chunk_tokens:
                break
            rows, held = rows + 1, held + more
        sizes.append(rows)
        start += rows
    return order, sizes


def cut(value: Mapping[str, Any], order: torch.Tensor, sizes: list[int], layout: VisionLayout | None = None,
        leading: bool = False) -> list[Any]:
    """Rows `order` of every tensor of `value` (with their images, under a vision `layout`), in consecutive
    chunks of `sizes` rows, each trimmed."""
    rows = len(order)
    chunks, start = [], 0
    for size in sizes:
        index = order[start : start + size]
        if layout is not None:
            chunk = take(value, layout, index.tolist(), lambda entry: per_example(entry, rows))
        else:
            chunk = {k: _rows(v, index, rows) for k, v in value.items()}
        chunks.append(trim_padding(chunk, leading))
        start += size
    return chunks


def _rows(value: Any, index: torch.Tensor, rows: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
        return value.index_select(0, index.to(value.device))
    if not isinstance(value, torch.Tensor) and per_example(value, rows):
        picked = [value[j] for j in index.tolist()]
        return picked if isinstance(value, list) else tuple(picked)
    return value


def split_to_count(sizes: list[int], count: int) -> list[int]:
    """More chunks without changing any result: halve the largest chunk until there are `count` (for FSDP2,
    where every rank must run as many chunks). Fewer rows than `count` cannot be split so far: unchanged."""
    sizes = list(sizes)
    while len(sizes) < count and max(sizes) > 1:
        j = max(range(len(sizes)), key=sizes.__getitem__)
        big = sizes[j]
        sizes[j : j + 1] = [big - big // 2, big // 2]
    return sizes
