"""The errors for a value that must be finite and is not (NaN or infinite), one type per place it is found.

Training programs tell divergence from a bug by these types, never by an error's text:

    try:
        strategy.step(x, y)
    except gradcache.NonFiniteError:   # the loss, an embedding or a recomputed embedding went NaN/inf
        ...                            # nothing of this step's gradient was written
"""
from __future__ import annotations


class NonFiniteError(ValueError):
    """A loss or an embedding is NaN or infinite; raised before any gradient of that step is written."""


class NonFiniteLossError(NonFiniteError):
    """The loss of a step is NaN or infinite."""


class NonFiniteEmbeddingError(NonFiniteError):
    """An embedding handed to a loss has NaN or infinite entries."""


class NonFiniteRecomputationError(NonFiniteError):
    """Phase (3) of GradCache re-encoded a chunk into NaN or infinite entries where phase (1) had finite ones."""
