"""Token-level embeddings: the (B, L, D) vectors of a late-interaction model (ColBERT) and the (B, L) mask of the
positions that count.

An encoder (or `get_embedding`) returns `TokenEmbeddings(values, mask)` for one loss argument of token vectors.
The mask is the one the MODEL returns, its scoring mask, not the input's attention mask: ColBERT's query
expansion scores positions its attention does not see, and a skiplist drops positions it does see. A loss scores
the positions where the mask is True and ignores the others, whatever their values.

How the strategies carry them (each step in one function here, dispatched on the kind, so the core reads the same
for vectors and tokens):
  - chunks of different lengths L_k are joined padded to the longest (values 0, mask False): `join`;
  - the loss gets one `TokenEmbeddings` per output, its values requiring grad, its mask a constant;
  - each chunk's cached gradient is cut back to its own rows and its own length, grad[:, :L_k]: `piece`;
  - token-chunked rows are put back in the caller's order, values and mask alike: `rows`;
  - under torch.distributed every rank pads to the global longest before the gather (`gradcache.distributed`).
Phase (1)'s sparse cache of (B, V) rows (`sparse_cache=True`, `gradcache.sparse_rows.SparseRows`) takes the same
doors: its values are the non-zeros, a piece of it is a chunk's dense rows.

An integer mask's values (0 and 1 only) are checked on the device and read once where the chunks are joined
(`join`), or where a loss checks its arguments (`checked` again), not once per chunk: a read of a device tensor
makes the host wait for the device.
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from gradcache.sparse_rows import SparseRows, check_nonnegative, dense_piece, join_sparse

__all__ = ["TokenEmbeddings", "Embedding", "checked", "check_mask_values", "values_of", "with_values", "length_of", "row_count", "join",
           "piece", "rows", "padded_to"]


class TokenEmbeddings(NamedTuple):
    """values: (B, L, D) floating token vectors; mask: (B, L) bool, True where a position counts.

    Example:
        >>> hidden = bert(input_ids, attention_mask).last_hidden_state  # (B, L, H)
        >>> return TokenEmbeddings(F.normalize(project(hidden), dim=-1), attention_mask.bool())
    """

    values: torch.Tensor
    mask: torch.Tensor


# The signature as the source writes it, as `inspect` reads every other one here (postponed, string annotations)
TokenEmbeddings.__new__.__annotations__ = {"values": "torch.Tensor", "mask": "torch.Tensor"}

Embedding = torch.Tensor | TokenEmbeddings  # one loss argument: vectors (B, D) or token embeddings


def checked(embedding: TokenEmbeddings, name: str) -> TokenEmbeddings:
    """`embedding` with its mask as a bool constant, or a TypeError/ValueError naming `name` and the fix.

    Raises:
        TypeError: values not a floating-point tensor; mask not a tensor, or of a floating or complex dtype.
        ValueError: values not 3-D (B, L, D); a mask of another shape than values' (B, L); an integer mask
            holding anything but 0 and 1, raised where its chunks are joined (`join`) or where `checked` meets the
            bool mask it made (`check_mask_values`).
    """
    values, mask = embedding
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        what = type(values).__name__ if not isinstance(values, torch.Tensor) else f"a {values.dtype} tensor"
        raise TypeError(f"{name}: TokenEmbeddings.values is {what}; it must be a floating-point tensor (B, L, D).")
    if values.dim() != 3:
        raise ValueError(
            f"{name}: TokenEmbeddings.values has shape {tuple(values.shape)}; it must be 3-D (B, L, D): one row per "
            "example, one vector per token. Return a (B, D) tensor instead for one vector per example."
        )
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: TokenEmbeddings.mask is a {type(mask).__name__}; it must be a (B, L) bool tensor.")
    if tuple(mask.shape) != tuple(values.shape[:2]):
        raise ValueError(
            f"{name}: TokenEmbeddings.mask has shape {tuple(mask.shape)} but values has shape "
            f"{tuple(values.shape)}; the mask must be (B, L) = {tuple(values.shape[:2])}, one entry per token vector."
        )
    if mask.dtype == torch.bool:
        check_mask_values([mask])  # an integer mask an earlier `checked` made bool and left unchecked
        return TokenEmbeddings(values, mask.detach())
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(
            f"{name}: TokenEmbeddings.mask has dtype {mask.dtype}; it must be bool (or an integer tensor of 0 and "
            "1), True where a position counts: pass mask.bool() or mask > 0.5."
        )
    as_bool = mask.detach() != 0
    _UNCHECKED[as_bool] = (mask.detach(), name)  # read by `check_mask_values`, where the chunks meet
    return TokenEmbeddings(values, as_bool)


# bool masks made from integer ones whose values are not read yet -> (the integer mask, the name for its error)
_UNCHECKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def check_mask_values(masks: Sequence[torch.Tensor]) -> None:
    """Raise a ValueError naming the encoder if a mask among `masks` came from an integer mask holding anything but
    0 and 1 (`checked`); one host read for all of them, none when no mask is pending."""
    pending = [(_UNCHECKED.pop(m), m) for m in masks if m in _UNCHECKED]
    if not pending:
        return
    bad = [(mask != 0) & (mask != 1) for (mask, _), _ in pending]
    if not bool(torch.stack([b.any() for b in bad]).any()):
        return
    k = next(k for k, b in enumerate(bad) if bool(b.any()))
    (mask, name), _ = pending[k]
    found = sorted(set(mask[bad[k]].unique().tolist()))[:5]
    raise ValueError(
        f"{name}: TokenEmbeddings.mask holds {found}, not only 0 and 1; it must be bool (or 0/1), True where "
        "a position counts."
    )


def values_of(embedding: Embedding) -> torch.Tensor:
    """The tensor that carries the gradient: the embedding itself, its token values, or its non-zeros."""
    return embedding.values if isinstance(embedding, (TokenEmbeddings, SparseRows)) else embedding


def with_values(embedding: Embedding, change: Callable[[torch.Tensor], torch.Tensor]) -> Embedding:
    """`change` applied to the values (a cast, a detach, requires_grad_), the mask kept."""
    if isinstance(embedding, TokenEmbeddings):
        return TokenEmbeddings(change(embedding.values), embedding.mask)
    if isinstance(embedding, SparseRows):
        return embedding._replace(values=change(embedding.values))
    return change(embedding)


def length_of(embedding: Embedding) -> int | None:
    """L of token embeddings; None for vectors."""
    return embedding.values.shape[1] if isinstance(embedding, TokenEmbeddings) else None


def row_count(embedding: Embedding | SparseRows) -> int:
    """B: the examples an embedding holds."""
    return embedding.size[0] if isinstance(embedding, SparseRows) else values_of(embedding).shape[0]


def padded_to(embedding: TokenEmbeddings, length: int) -> TokenEmbeddings:
    """Token embeddings padded at the end to `length` positions: values 0, mask False (differentiable)."""
    extra = length - embedding.values.shape[1]
    if extra == 0:
        return embedding
    return TokenEmbeddings(F.pad(embedding.values, (0, 0, 0, extra)), F.pad(embedding.mask, (0, extra)))


def join(pieces: Sequence[Embedding], name: str) -> Embedding:
    """Chunks' embeddings concatenated along the rows; token embeddings padded to the longest first:
    (B_k, L_k, D) -> (sum B_k, max L_k, D). TypeError when chunks mix vectors and token embeddings."""
    if isinstance(pieces[0], SparseRows):
        joined = join_sparse(list(pieces))  # (sum B_k, V) by its non-zeros
        check_nonnegative(joined, name)
        return joined
    tokens = [isinstance(p, TokenEmbeddings) for p in pieces]
    if any(tokens) and not all(tokens):
        k = tokens.index(not tokens[0])
        first, other = ("token embeddings", "a tensor") if tokens[0] else ("a tensor", "token embeddings")
        raise TypeError(
            f"the encoder of {name} returned {first} for its first chunk and {other} for chunk {k + 1}; every chunk "
            "of an input must give the same kind of embedding."
        )
    if not tokens[0]:
        return torch.cat(list(pieces))  # (sum B_k, D)
    check_mask_values([p.mask for p in pieces])
    longest = max(p.values.shape[1] for p in pieces)
    padded = [padded_to(p, longest) for p in pieces]
    return TokenEmbeddings(torch.cat([p.values for p in padded]), torch.cat([p.mask for p in padded]))


def piece(joined: Embedding, start: int, stop: int, length: int | None) -> Embedding:
    """Rows start..stop of a joined embedding (or of its gradient), token embeddings cut back to `length`
    positions: the chunk as its encoder returned it, grad[start:stop, :L_k]."""
    if isinstance(joined, TokenEmbeddings):
        return TokenEmbeddings(joined.values[start:stop, :length], joined.mask[start:stop, :length])
    if isinstance(joined, SparseRows):
        return dense_piece(joined, start, stop)  # (stop - start, V), 0 off the non-zeros
    return joined[start:stop] if length is None else joined[start:stop, :length]


def rows(embedding: Embedding, index: torch.Tensor) -> Embedding:
    """The rows `index` of an embedding, values and mask alike."""
    if isinstance(embedding, TokenEmbeddings):
        index = index.to(embedding.values.device)
        return TokenEmbeddings(embedding.values[index], embedding.mask[index])
    return embedding[index.to(embedding.device)]
