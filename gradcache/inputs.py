"""Inputs: how long a batch is, how it splits into chunks, how a chunk reaches its encoder, what comes back.

An input, and how each of its chunks reaches the encoder:
  - a tensor: `encoder(chunk)`;
  - a mapping of tensors (a tokenizer's `input_ids` and `attention_mask`): `encoder(**chunk)`;
  - a tuple or list of tensors: `encoder(*chunk)`;
  - a pair `(args, kwargs)`, a tuple or list of two whose first is a tuple or list and whose second is a
    mapping: `encoder(*args, **kwargs)`;
  - raw texts, a non-empty list or tuple of strings (or of text pairs, tuples of strings), for an encoder that
    tokenises itself: `encoder(texts)`, split into slices of the list;
  - `Chunks([...])` (gradcache/chunks.py), ready-made chunks: each is one chunk, of any kind above;
  - anything else: `encoder(chunk)`, split by the user's `split_fn`.
The tensors split along dim 0. A `split_fn` given for an input splits it whatever its type; its chunks reach
the encoder by the same rules.

The other values of a mapping, sequence or pair input, with B the batch's length (its tensors' dim 0):
  - a list or tuple of B entries holds one entry per example (labels, strings, per-example scales): split,
    reordered and trimmed with the rows, like the tensors;
  - any other value (a number, a flag, a string, None, a list or tuple of another length, a mapping) is one
    setting for the whole batch: passed whole to every chunk;
  - where that rule cannot be right, the input is refused (TypeError) before anything runs: another kind of
    object of length B (a NumPy array, a range: make it a tensor or a list), or a nested container holding
    tensors of B rows (they would reach every chunk whole: make them top-level entries).
A batch of one example splits into one chunk, where every value reaches the encoder as given.

What comes back: the encoder's output, or `get_embedding(output)`, is one embedding tensor (B, D) or a tuple or
list of several (B_k, D_k), each a loss argument of its own, in order (each concatenated over the chunks and
gathered over ranks alone, so B_k may differ from B, except under `chunk_tokens`, which reorders rows). An
embedding may also be `TokenEmbeddings(values (B, L, D), mask (B, L))`, token vectors with the mask of the
positions the model scores (see token_embeddings.py).

Trimming (`trim_padding`, and the chunks of `chunk_tokens`) keeps every column that some row of the chunk attends
to (`attention_mask`) or scores: sentence-transformers marks ColBERT's query-expansion positions, scored though
not attended, in `query_expansion_positions`, and those columns stay too.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.chunks import Chunks
from gradcache.token_embeddings import TokenEmbeddings, checked, join
from gradcache.vision_inputs import TOKEN_AXIS_KEYS, VISION_KEYS, VisionHints, VisionLayout, take, vision_layout

SCORED_POSITIONS = "query_expansion_positions"  # (B, L): positions scored though not attended (ColBERT's expansion)

SplitFn = Callable[[Any, int], Sequence[Any]]
GetEmbedding = Callable[[Any], torch.Tensor | TokenEmbeddings | Sequence[torch.Tensor | TokenEmbeddings]]


def is_pair(value: Any) -> bool:
    """Whether an input or chunk is `(args, kwargs)`, run as `encoder(*args, **kwargs)`."""
    return (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (tuple, list))
            and isinstance(value[1], Mapping))


def _entries(value: Any) -> list[tuple[str, Any]]:
    """The top-level entries of a mapping, sequence or pair input, each with its place in the input."""
    if isinstance(value, Mapping):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if is_pair(value):
        args, kwargs = value
        return [(f"[0][{i}]", v) for i, v in enumerate(args)] + [(f"[1][{k!r}]", v) for k, v in kwargs.items()]
    if isinstance(value, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return []


def _rebuilt(value: Any, entries: list[Any]) -> Any:
    """`value` (a mapping, sequence or pair) with its top-level entries replaced, in `_entries`' order."""
    if isinstance(value, Mapping):
        return dict(zip(value.keys(), entries))
    if is_pair(value):
        args, kwargs = value
        return type(value)((type(args)(entries[: len(args)]), dict(zip(kwargs.keys(), entries[len(args) :]))))
    return type(value)(entries)


def is_texts(value: Any) -> bool:
    """Whether an input or chunk is raw texts: a non-empty list or tuple of strings, or of text pairs (tuples or
    lists of strings), run as `encoder(texts)` by an encoder that tokenises itself."""
    return isinstance(value, (list, tuple)) and bool(value) and (
        all(isinstance(v, str) for v in value)
        or all(isinstance(v, (tuple, list)) and v and all(isinstance(t, str) for t in v) for v in value)
    )


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors at the top level of an input or chunk: the value itself, or its entries that are tensors."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [v for _, v in _entries(value) if isinstance(v, torch.Tensor)]


def batch_length(value: Any, name: str, split_by_user: bool = False, hints: VisionHints | None = None) -> int | None:
    """The number of examples in one input, checking that its tensors agree and that each of its other
    values is either per-example or per-batch (see the module docstring); None for a custom type. With
    `split_by_user` (a `split_fn` applies to it) the user's chunks decide: the length where the tensors agree,
    else None, and no check. A VLM processor's batch (gradcache/vision_inputs.py) has its rows' images told
    apart here, with `hints` (the encoder's image token), or is refused."""
    if isinstance(value, Chunks):
        return _chunks_length(value, name, split_by_user, hints)
    if is_texts(value):
        return len(value)
    tensors = tensors_of(value)
    if split_by_user:
        lengths = {t.shape[0] for t in tensors if t.dim() > 0}
        return lengths.pop() if len(lengths) == 1 else None
    if not tensors:
        if isinstance(value, (torch.Tensor, Mapping, tuple, list)):
            raise ValueError(
                f"{name} holds no tensor at its top level and is not raw texts (a list of strings); pass a tensor, "
                "a mapping or a sequence of tensors, a pair (args, kwargs) of a list and a mapping holding them, "
                "or a list of strings for an encoder that tokenises itself; wrap ready-made chunks (a loader's "
                "sub-batches) in gradcache.Chunks([...]); or give split_fn=lambda value, chunk_size: [...] to "
                "split it yourself."
            )
        return None
    for t in tensors:
        if t.dim() == 0:
            raise ValueError(f"{name} holds a 0-dimensional tensor; every tensor needs a batch dimension (dim 0).")
    layout = layout_of(value, name, hints)
    if layout is not None:  # its item-axis keys hold the rows' images, not rows
        tensors = [v for k, v in value.items() if isinstance(v, torch.Tensor) and k not in layout.spans]
    lengths = {t.shape[0] for t in tensors}
    entries = _entries(value)  # a tensor holds nothing beside its rows
    if len(lengths) > 1:
        if isinstance(value, Mapping):
            detail = ", ".join(f"{k}: {v.shape[0]}" for k, v in value.items() if isinstance(v, torch.Tensor))
        else:
            detail = ", ".join(f"{place}: {v.shape[0]}" for place, v in entries if isinstance(v, torch.Tensor))
        raise ValueError(
            f"{name} has tensors of different lengths along dim 0 ({detail}); all must be equal, or give split_fn "
            "to split it yourself."
        )
    rows = lengths.pop()
    for place, entry in entries:
        if not isinstance(entry, torch.Tensor):
            per_example(entry, rows, f"{name}{place}")
    return rows


def _chunks_length(value: Chunks, name: str, split_by_user: bool, hints: VisionHints | None) -> int | None:
    """The examples of ready-made chunks: their sum, each chunk checked as an input; None if one is a custom type."""
    if split_by_user:
        raise ValueError(
            f"{name} is given as gradcache.Chunks and split_fn applies to it, and each would decide its chunks; "
            "drop split_fn for it (one per input with None there, e.g. split_fn=[None, split_images]), or pass the "
            "unsplit input without Chunks."
        )
    lengths = [batch_length(chunk, f"chunk {k + 1} of {name}", hints=hints) for k, chunk in enumerate(value)]
    for k, length in enumerate(lengths):
        if length == 0:
            raise ValueError(f"chunk {k + 1} of {name} is an empty batch (0 examples); every chunk needs one.")
    return None if None in lengths else sum(lengths)


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


def layout_of(value: Any, name: str, hints: VisionHints | None = None) -> VisionLayout | None:
    """The vision layout of a mapping input (gradcache/vision_inputs.py), None for any other input."""
    return vision_layout(value, name, hints or VisionHints()) if isinstance(value, Mapping) else None


def own_images(chunk: Any, name: str, hints: VisionHints | None = None) -> Any:
    """A ready-made chunk without the pixel keys its rows own nothing of (an Idefics3 chunk of text-only rows
    holds all-padding tiles, which the model cannot reshape); any other chunk as it is."""
    layout = layout_of(chunk, name, hints)
    if layout is None or layout.rows == 0:
        return chunk
    return take(chunk, layout, list(range(layout.rows)), lambda entry: per_example(entry, layout.rows))


def split(value: Any, chunk_size: int, split_fn: SplitFn | None = None, name: str = "the input",
          hints: VisionHints | None = None) -> list[Any]:
    """`split_fn(value, chunk_size)` when given, whatever the input's type; otherwise split along dim 0 into
    chunks of `chunk_size` rows (the last may be shorter), views, no copies. Lists and tuples of one entry per
    example are sliced alike; other values reach every chunk whole. A VLM processor's batch splits by its rows,
    each chunk holding its rows' images (gradcache/vision_inputs.py)."""
    if isinstance(value, Chunks):
        return [own_images(c, f"chunk {k + 1} of {name}", hints) for k, c in enumerate(value)]
    if split_fn is not None:
        return _user_chunks(split_fn(value, chunk_size), name)
    if isinstance(value, torch.Tensor):
        return list(value.split(chunk_size))
    if is_texts(value):
        return [value[start : start + chunk_size] for start in range(0, len(value), chunk_size)]
    if not isinstance(value, (Mapping, tuple, list)):
        raise TypeError(
            f"cannot split {name}, of type {type(value).__name__}; pass a tensor, a mapping or a sequence of "
            "tensors, raw texts (a list of strings), ready-made chunks in gradcache.Chunks([...]), or give "
            "split_fn=lambda value, chunk_size: [...] that returns its chunks."
        )
    layout = layout_of(value, name, hints)
    if layout is not None:
        index = list(range(layout.rows))
        return [take(value, layout, index[start : start + chunk_size], lambda e: per_example(e, layout.rows))
                for start in range(0, layout.rows, chunk_size)]
    rows = tensors_of(value)[0].shape[0]
    entries = [entry for _, entry in _entries(value)]
    pieces = [_pieces(entry, rows, chunk_size, place) for place, entry in _entries(value)]
    count = -(-rows // chunk_size)
    return [_rebuilt(value, [p[k] if p is not None else e for p, e in zip(pieces, entries)]) for k in range(count)]


def _user_chunks(chunks: Any, name: str) -> list[Any]:
    """What a `split_fn` returned, as a list of chunks, or a TypeError/ValueError that says what it should be."""
    if isinstance(chunks, (torch.Tensor, str, bytes, Mapping)) or not isinstance(chunks, Iterable):
        raise TypeError(
            f"split_fn returned a {type(chunks).__name__} for {name}; it must return the chunks as a list or tuple "
            "(e.g. list(value.split(chunk_size)) for a tensor)."
        )
    chunks = list(chunks)
    if not chunks:
        raise ValueError(f"split_fn returned no chunks for {name}; it must return at least one.")
    return chunks


def _pieces(entry: Any, rows: int, chunk_size: int, place: str) -> Sequence[Any] | None:
    """One entry of a mapping, sequence or pair input in chunks, or None for a setting every chunk gets whole."""
    if isinstance(entry, torch.Tensor):
        return entry.split(chunk_size)
    if per_example(entry, rows, f"an input's entry {place}"):
        return [entry[start : start + chunk_size] for start in range(0, rows, chunk_size)]
    return None


def kept_positions(keywords: Mapping[str, Any]) -> torch.Tensor:
    """(B, L) bool: the positions a row attends to (`attention_mask`) or scores (`query_expansion_positions`,
    where present with the same shape); trimming never drops a column that holds one."""
    mask = keywords["attention_mask"].ne(0)
    scored = keywords.get(SCORED_POSITIONS)
    if isinstance(scored, torch.Tensor) and scored.shape == mask.shape:
        mask = mask | scored.ne(0)
    return mask


def trim_padding(chunk: Any, leading: bool = False) -> Any:
    """Drop the trailing columns (and with `leading`, the leading ones) that are padding in every row of a chunk
    with an `attention_mask` (a mapping, or the mapping of a pair). A column scored though not attended
    (`query_expansion_positions`) is not padding. What is cut, by role: the token-axis keys (`input_ids`,
    `attention_mask`, `token_type_ids`, `mm_token_type_ids`, `position_ids`, Mllama's `cross_attention_mask`,
    ...; `vision_inputs.TOKEN_AXIS_KEYS`) along dim 1; never a vision key (`pixel_values`, tiles, grids), whatever
    its width; any other tensor as wide as the mask (a positional one included) alike.

    Exact only for encoders that ignore masked positions (attention masking and masked pooling); the library
    cannot check that, so the strategies do this only when asked (`trim_padding=True`). Leading columns only
    where positions come from the mask (Qwen2-VL's rope index) or the chunk carries its `position_ids`: the
    strategies decide (`vision_inputs.positions_from_mask`).
    """
    if isinstance(chunk, Chunks):
        return Chunks([trim_padding(c, leading) for c in chunk])
    keywords = chunk[1] if is_pair(chunk) else chunk
    if not isinstance(keywords, Mapping) or "attention_mask" not in keywords:
        return chunk
    mask = keywords["attention_mask"]
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return chunk
    first, end = kept_columns(kept_positions(keywords), leading)
    width = mask.shape[1]
    if (first, end) == (0, width):
        return chunk
    return _rebuilt(chunk, [
        v[:, first:end] if _on_token_axis(place, v, width) else v for place, v in _entries(chunk)
    ])


def kept_columns(kept: torch.Tensor, leading: bool = False) -> tuple[int, int]:
    """The columns [first, end) that trimming keeps of a (B, L) bool of kept positions: up to the last kept one,
    from the first with `leading` (else from 0); one column where none is kept."""
    columns = kept.any(dim=0).nonzero()
    if not columns.numel():
        return 0, 1
    first = int(columns.min()) if leading else 0
    return first, int(columns.max()) + 1


def _on_token_axis(place: str, value: Any, width: int) -> bool:
    """Whether an entry of a chunk is cut with the mask: by its key's role, or, for a key of no known role (or a
    positional entry), by its width."""
    if not (isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == width):
        return False
    key = place.rsplit("[", 1)[-1].strip("]'\"")
    if key in TOKEN_AXIS_KEYS:
        return True
    return key not in VISION_KEYS


def encode(
    encoder: nn.Module, chunk: Any, get_embedding: GetEmbedding | None, name: str,
) -> list[torch.Tensor | TokenEmbeddings]:
    """Run the encoder on a chunk (see the module docstring for how it is called); its embeddings, one or several,
    token embeddings with their mask as a bool constant.

    Raises:
        TypeError: the output (after `get_embedding`) is not a floating-point tensor with a batch dimension, nor
            `TokenEmbeddings`, nor a non-empty tuple or list of them.
        TypeError, ValueError: `TokenEmbeddings` whose mask is not bool (or 0/1), or not of the values' (B, L).
    """
    if isinstance(chunk, Chunks):  # FullBatch's whole input: each chunk with a graph, concatenated in order
        outputs = [encode(encoder, c, get_embedding, f"chunk {k + 1} of {name}") for k, c in enumerate(chunk)]
        for k, output in enumerate(outputs):
            check_embedding_count(output, len(outputs[0]), name, k)
        return [join(slot, name) for slot in zip(*outputs)]  # token embeddings padded to the longest
    if isinstance(chunk, Mapping):
        output = encoder(**chunk)
    elif is_pair(chunk):
        output = encoder(*chunk[0], **chunk[1])
    elif is_texts(chunk):
        output = encoder(chunk)
    elif isinstance(chunk, (tuple, list)):
        output = encoder(*chunk)
    else:
        output = encoder(chunk)
    embedding = get_embedding(output) if get_embedding is not None else output
    several = isinstance(embedding, (tuple, list)) and not isinstance(embedding, TokenEmbeddings)
    embeddings = list(embedding) if several else [embedding]
    for k, e in enumerate(embeddings):
        where = f" at position {k} of the {type(embedding).__name__} it returned" if several else ""
        if isinstance(e, TokenEmbeddings):
            embeddings[k] = checked(e, f"the encoder of {name}{where}")
            continue
        if not (isinstance(e, torch.Tensor) and e.is_floating_point() and e.dim() >= 1):
            what = type(e).__name__ if not isinstance(e, torch.Tensor) else (
                f"a {e.dtype} tensor" if not e.is_floating_point() else "a 0-dimensional tensor")
            raise TypeError(
                f"the encoder of {name} returned {what}{where}, not a floating-point tensor of embeddings with a "
                "batch dimension (B, D), nor gradcache.TokenEmbeddings(values, mask) of token vectors, nor a tuple "
                "of such (one loss argument each); pass get_embedding=lambda output: ... that picks the "
                "embedding(s) out of the encoder's output."
            )
    if not embeddings:
        raise TypeError(
            f"the encoder of {name} returned an empty {type(embedding).__name__}; return at least one embedding "
            "tensor, or pass get_embedding=lambda output: ... that picks it out of the encoder's output."
        )
    return embeddings


def check_embedding_count(outputs: list[torch.Tensor | TokenEmbeddings], first: int, name: str, k: int) -> None:
    """Every chunk of an input gives as many embeddings as its first (`first`): each is concatenated over the
    chunks into one loss argument. TypeError otherwise, naming chunk `k` (from 0)."""
    if len(outputs) != first:
        raise TypeError(
            f"the encoder of {name} returned {first} embedding(s) for its first chunk and {len(outputs)} for chunk "
            f"{k + 1}; each embedding is one loss argument, concatenated over the chunks, so every chunk must give "
            "as many. Return a fixed number (get_embedding can pick them out of the output)."
        )
