"""Argument checks shared by every loss: each raises before any state is touched and names the bad input.

Hyperparameters are checked once in ``__init__``; embeddings on every ``forward``. The NaN/inf count is a
reduction over (N, D), cheap next to the N x N similarity work of the loss itself; it runs over blocks of
``CHECK_ROWS`` rows, so that its temporaries are not a copy of the inputs beside a tiled loss that keeps none.
"""

from __future__ import annotations

from numbers import Real

import torch

from gradcache.non_finite import NonFiniteEmbeddingError
from gradcache.ranges import check_int, is_finite

__all__ = ["check_tile_size", "check_column_tile_size", "check_temperature", "check_finite_number",
           "check_embeddings", "check_same_rows"]

CHECK_ROWS = 4096  # rows per block of the NaN/inf count


def check_tile_size(tile_size: object) -> int | None:
    """Return ``tile_size`` if it is None or an int >= 1; raise ValueError naming it otherwise."""
    return check_int(tile_size, "tile_size", optional="dense", meaning="rows per tile")


def check_column_tile_size(column_tile_size: object, tile_size: int | None) -> int | None:
    """Return ``column_tile_size`` if it is None or an int >= 1 beside a set ``tile_size``; raise otherwise."""
    if column_tile_size is None:
        return None
    check_int(column_tile_size, "column_tile_size", optional="square tiles of tile_size", meaning="columns per tile")
    if tile_size is None:
        raise ValueError(
            f"column_tile_size={column_tile_size} needs tile_size set too: the dense loss (tile_size=None) has no "
            f"tiles; pass tile_size=<rows per tile> or drop column_tile_size"
        )
    return column_tile_size


def check_temperature(temperature: object, name: str = "temperature") -> float:
    """Return ``temperature`` as a float if it is a finite real number > 0; raise ValueError otherwise."""
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise ValueError(f"{name} must be a positive real number such as 0.05, got {temperature!r}")
    value = float(temperature)
    if not is_finite(value) or value <= 0.0:
        raise ValueError(
            f"{name} must be a finite number > 0 (it divides the cosine similarity), got {temperature!r}"
        )
    return value


def check_finite_number(value: object, name: str) -> float:
    """Return ``value`` as a float if it is a finite real number; raise ValueError naming ``name`` otherwise."""
    if not is_finite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def check_embeddings(**named: torch.Tensor) -> None:
    """Check that each named input is a finite, floating (N, D) tensor and that all share the same D.

    Raises:
        TypeError: an input is not a tensor, or its dtype is not floating point.
        ValueError: an input is not 2-D, is empty, has NaN/inf entries, or its width differs from the first's.
    """
    first_name, first_width = None, None
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (N, D), got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(
                f"{name} must have a floating dtype (float32, float64, bfloat16, float16), got {tensor.dtype}; "
                f"pass embeddings, not token ids or labels"
            )
        if tensor.ndim != 2:
            raise ValueError(
                f"{name} must be 2-D (N, D), got shape {tuple(tensor.shape)}; flatten or pool to one row per item"
            )
        if tensor.shape[1] == 0:
            raise ValueError(f"{name} has width 0, got shape {tuple(tensor.shape)}; embeddings need D >= 1")
        if first_width is None:
            first_name, first_width = name, tensor.shape[1]
        elif tensor.shape[1] != first_width:
            raise ValueError(
                f"{name} has width {tensor.shape[1]} but {first_name} has width {first_width}; "
                f"project both to the same embedding size"
            )
        with torch.no_grad():
            bad = int(sum((~torch.isfinite(block)).sum() for block in tensor.split(CHECK_ROWS)))  # one sync
        if bad:
            raise NonFiniteEmbeddingError(f"{name} has {bad} NaN/inf entries (shape {tuple(tensor.shape)})")


def check_same_rows(**named: torch.Tensor) -> int:
    """Return the common row count N of the named (N, D) tensors; raise ValueError if it differs or is 0."""
    counts = {name: tensor.shape[0] for name, tensor in named.items()}
    first_name, first_count = next(iter(counts.items()))
    for name, count in counts.items():
        if count != first_count:
            raise ValueError(
                f"{name} has {count} rows but {first_name} has {first_count}; row i of each must be the pair "
                f"of row i of the other, so both need the same batch size"
            )
    if first_count == 0:
        raise ValueError(f"{first_name} has 0 rows; the loss needs a batch of at least 1")
    return first_count
