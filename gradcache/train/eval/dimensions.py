"""The held-out metrics of a Matryoshka run (`--matryoshka-dims`) at each embedding width it trained.

    metric@d = the mode's metric on e[:, :d] / ||e[:, :d]||,  for every d of --matryoshka-dims but the full width

Each held-out set is embedded once; every width scores the first d columns of the same embeddings, re-normalised
as the full-width evaluation normalises (the first d columns of a unit row, re-normalised, are those of the raw
row, re-normalised). The full-width metrics keep their names; the others are suffixed `@d`: `mrr@10@128`,
`knn_top1@64`, `image_to_text_recall@1@128`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def evaluation_dims(dims: Sequence[int] | None, width: int) -> list[int]:
    """The widths scored beside the full one: every d of `dims` below `width` (none without `dims`)."""
    return [dim for dim in dims or () if dim < width]


def truncated(embeddings: np.ndarray, dim: int) -> np.ndarray:
    """(N, D) embeddings -> (N, dim): their first `dim` columns, each row L2-normalised (a zero row stays zero)."""
    prefix = np.ascontiguousarray(embeddings[:, :dim], dtype=np.float32)
    norms = np.linalg.norm(prefix, axis=1, keepdims=True)
    return prefix / np.maximum(norms, np.finfo(np.float32).tiny)


def at_dim(metrics: dict[str, float], dim: int) -> dict[str, float]:
    """`metrics` named for width `dim`: `<metric>@<dim>`."""
    return {f"{key}@{dim}": value for key, value in metrics.items()}
