"""Inputs: how long a batch is, how it splits into chunks, how a chunk reaches its encoder.

An input is a tensor, a mapping of tensors (a tokenizer's `input_ids` and `attention_mask`) or a tuple or
list of tensors; all split along dim 0. Anything else goes through the user's `split_fn` hook.

The other values of a mapping or sequence input, with B the batch's length (its tensors' dim 0):
  - a list or tuple of B entries holds one entry per example (labels, strings, per-example scales): split,
    reordered and trimmed with the rows, like the tensors;
  - any other value (a number, a flag, a string, None, a list or tuple of another length, a mapping) is one
    setting for the whole batch: passed whole to every chunk;
  - where that rule cannot be right, the input is refused (TypeError) before anything runs: another kind of
    object of length B (a NumPy array, a range: make it a tensor or a list), or a nested container holding
    tensors of B rows (they would reach every chunk whole: make them top-level entries).
A batch of one example splits into one chunk, where every value reaches the encoder as given.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

SplitFn = Callable[[Any, int], Sequence[Any]]
GetEmbedding = Callable[[Any], torch.Tensor]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def batch_length(value: Any, name: str) -> int | None:
    """The number of examples in one input, checking that its tensors agree and that each of its other
    values is either per-example or per-batch (see the module docstring); None for a custom type."""
    tensors = _tensors(value)
    if not tensors:
        if isinstance(value, (torch.Tensor, Mapping, tuple, list)):
            raise ValueError(f"{name} holds no tensor; pass a tensor, a mapping or a sequence of tensors.")
        return None
    for t in tensors:
        if t.dim() == 0:
            raise ValueError(f"{name} holds a 0-dimensional tensor; every tensor needs a batch dimension (dim 0).")
    lengths = {t.shape[0] for t in tensors}
    if len(lengths) > 1:
        if isinstance(value, Mapping):
            detail = ", ".join(f"{k}: {v.shape[0]}" for k, v in value.items() if isinstance(v, torch.Tensor))
        else:
            detail = ", ".join(str(t.shape[0]) for t in tensors)
        raise ValueError(f"{name} has tensors of different lengths along dim 0 ({detail}); all must be equal.")
    rows = lengths.pop()
    entries: list[tuple[Any, Any]] = []  # a tensor holds nothing beside its rows
    if isinstance(value, Mapping):
        entries = list(value.items())
    elif isinstance(value, (tuple, list)):
        entries = list(enumerate(value))
    for key, entry in entries:
        if not isinstance(entry, torch.Tensor):
            per_example(entry, rows, f"{name}[{key!r}]")
    return rows


def per_example(value: Any, rows: int, name: str = "a value") -> bool:
    """Whether a non-tensor value of a mapping or sequence input of `rows` examples holds one entry per example
    (a list or tuple of `rows` entries: split like the tensors) or is one setting for the whole batch (passed
    whole to every chunk); TypeError where neither can be right (see the module docstring)."""
    if isinstance(value, (list, tuple)) and len(value) == rows:
        return True
    if rows > 1 and not isinstance(value, (str, bytes, Mapping, list, tuple)):
        try:
            length = len(value)
        except TypeError:  # no length: a number, a flag, None, an object
            length = None
        if length == rows:
            raise TypeError(
                f"{name} is a {type(value).__name__} of {rows} entries, the batch's length: it may hold one entry per "
                "example, which gradcache splits only as a tensor, a list or a tuple. Convert it "
                "(torch.as_tensor(value) or list(value)) to split it with the examples; a setting for the whole "
                "batch that happens to have that length belongs in the encoder (an attribute or functools.partial)."
            )
    nested = [t for t in _nested_tensors(value) if t.dim() >= 1 and t.shape[0] == rows]
    if rows > 1 and nested:
        raise TypeError(
            f"{name} is a {type(value).__name__} holding tensors of {rows} rows, the batch's length; a nested "
            "container is passed whole to every chunk, so those rows would not be split. Make each tensor a "
            "top-level entry of the input (e.g. {'view_0': ..., 'view_1': ...}), or give your own batch type "
            "and split_fn."
        )
    return False


def _nested_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _nested_tensors(v)]
    return []


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in an input or chunk (used to find the devices a chunk runs on)."""
    return _tensors(value)


def split(value: Any, chunk_size: int, split_fn: SplitFn | None = None) -> list[Any]:
    """Split along dim 0 into chunks of `chunk_size` rows (the last may be shorter); views, no copies. Lists
    and tuples of one entry per example are sliced alike; other values reach every chunk whole."""
    if isinstance(value, torch.Tensor):
        return list(value.split(chunk_size))
    if isinstance(value, Mapping):
        pieces = {k: _pieces(v, value, chunk_size, k) for k, v in value.items()}
        count = max(len(p) for p in pieces.values() if p is not None)
        return [
            {k: (p[i] if p is not None else value[k]) for k, p in pieces.items()} for i in range(count)
        ]
    if isinstance(value, (tuple, list)):
        pieces = [_pieces(v, value, chunk_size, k) for k, v in enumerate(value)]
        count = max(len(p) for p in pieces if p is not None)
        return [type(value)(p[i] if p is not None else v for p, v in zip(pieces, value)) for i in range(count)]
    if split_fn is None:
        raise TypeError(
            f"cannot split an input of type {type(value).__name__}; pass a tensor, a mapping or a sequence of "
            "tensors, or give split_fn=lambda value, chunk_size: [...] that returns its chunks."
        )
    return list(split_fn(value, chunk_size))


def _pieces(entry: Any, value: Any, chunk_size: int, key: Any) -> Sequence[Any] | None:
    """One entry of a mapping or sequence input in chunks, or None for a setting every chunk gets whole."""
    if isinstance(entry, torch.Tensor):
        return entry.split(chunk_size)
    rows = _tensors(value)[0].shape[0]
    if per_example(entry, rows, f"an input's entry {key!r}"):
        return [entry[start : start + chunk_size] for start in range(0, rows, chunk_size)]
    return None


def trim_padding(chunk: Any) -> Any:
    """Drop the trailing columns that are padding in every row of a mapping chunk with an `attention_mask`.

    Exact only for encoders that ignore masked positions (attention masking and masked pooling); the library
    cannot check that, so the strategies do this only when asked (`trim_padding=True`).
    """
    if not isinstance(chunk, Mapping) or "attention_mask" not in chunk:
        return chunk
    mask = chunk["attention_mask"]
    if mask.dim() != 2:
        return chunk
    kept = mask.ne(0).any(dim=0).nonzero()
    length = int(kept.max()) + 1 if kept.numel() else 1
    if length == mask.shape[1]:
        return chunk
    return {
        k: v[:, :length] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == mask.shape[1] else v
        for k, v in chunk.items()
    }


def encode(encoder: nn.Module, chunk: Any, get_embedding: GetEmbedding | None, name: str) -> torch.Tensor:
    """Run the encoder on a chunk (mapping: keyword arguments; tuple/list: positional; else one argument)."""
    if isinstance(chunk, Mapping):
        output = encoder(**chunk)
    elif isinstance(chunk, (tuple, list)):
        output = encoder(*chunk)
    else:
        output = encoder(chunk)
    embedding = get_embedding(output) if get_embedding is not None else output
    if not isinstance(embedding, torch.Tensor) or not embedding.is_floating_point():
        what = type(embedding).__name__ if not isinstance(embedding, torch.Tensor) else f"a {embedding.dtype} tensor"
        raise TypeError(
            f"the encoder of {name} returned {what}, not a floating-point tensor of embeddings; pass "
            "get_embedding=lambda output: ... that picks the embedding tensor out of the encoder's output."
        )
    return embedding
