"""`Chunks`: an input given as ready-made chunks (a loader's sub-batches), each encoded as one chunk."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch


class Chunks:
    """An input as ready-made chunks: `step(Chunks(sub_batches_x), Chunks(sub_batches_y))` encodes each chunk
    once without a graph and re-encodes it with one, never splitting or joining them (the one-call form of the
    original GradCache's `@cached` loop, gradcache/functional.py).

    Each chunk is an input of its own kind (a tensor, a mapping, a sequence, a pair, raw texts, or a custom
    type), reaching the encoder by the rules of gradcache/inputs.py; the chunks' embeddings are concatenated in
    order into the input's loss argument. `chunk_size` and `split_fn` do not apply to it (`split_fn` for the
    same input is refused); `trim_padding` trims each chunk. FullBatch encodes each chunk with a graph and
    concatenates; NaiveAccumulation takes chunk k of every input as micro-batch k.

    Args:
        chunks: the chunks, in order: a list or tuple of at least one.

    Raises:
        TypeError: `chunks` is not a list or tuple, or holds a `Chunks`.
        ValueError: no chunk.

    Example:
        >>> queries, documents = zip(*sub_batches)  # from a DataLoader
        >>> loss = GradCache(encoder, InfoNCE(), chunk_size=64).step(Chunks(queries), Chunks(documents))
    """

    def __init__(self, chunks: Iterable[Any]) -> None:
        if isinstance(chunks, (torch.Tensor, str, bytes, Mapping)) or not isinstance(chunks, (list, tuple)):
            raise TypeError(
                f"Chunks takes a list or tuple of chunks (e.g. the sub-batches of a DataLoader), got a "
                f"{type(chunks).__name__}; for one tensor split by the library, pass it without Chunks."
            )
        if not chunks:
            raise ValueError("Chunks got no chunk; give at least one chunk (a list of sub-batches).")
        if any(isinstance(chunk, Chunks) for chunk in chunks):
            raise TypeError("Chunks holds a Chunks; nest no further: give the chunks themselves.")
        self.chunks: tuple[Any, ...] = tuple(chunks)

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.chunks)

    def __getitem__(self, index: int) -> Any:
        return self.chunks[index]

    def __repr__(self) -> str:
        return f"Chunks({len(self.chunks)} chunks)"
