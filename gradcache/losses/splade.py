"""SPLADE's loss: an in-batch ranking loss over sparse vocabulary-sized rows plus weighted sparsity regularisers."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gradcache.sparse_rows import SparseRows, densify, join_sparse

from .checks import check_finite_number
from .infonce import InfoNCE
from .sparse_scores import plain_dot_infonce, sparse_infonce
from .sparsity import FlopsRegularizer, L1Regularizer

__all__ = ["SpladeLoss"]


class SpladeLoss(nn.Module):
    """L = base(q, p, n) + lambda_d * R_d([p; n]) + lambda_q * R_q(q), R the FLOPS regulariser by default.

    Paper: Formal et al. 2021, SPLADE v2, https://arxiv.org/abs/2109.10086 (FLOPS on queries and documents with
    their own weights). The defaults are sentence-transformers' ``SpladeLoss(model,
    SparseMultipleNegativesRankingLoss(model), document_regularizer_weight, query_regularizer_weight)``: the base
    loss is InfoNCE over dot products at temperature 1 (its ``scale=1.0``), the documents are every positive and
    hard negative, the queries the anchors; value and gradient equal it.

    After each call, ``parts`` holds the three terms, detached, for logging: ``base_loss``,
    ``document_regularizer_loss`` and ``query_regularizer_loss`` (each already weighted, the latter absent when
    ``query_regularizer_weight`` is None); the returned loss is their sum. Under GradCache the regularisers see
    the global batch, gathered from every rank (see ``sparsity.py``).

    Args:
        loss: the base in-batch loss, called ``loss(query, positive)`` or ``loss(query, positive, negatives)``;
            None for ``InfoNCE(temperature=1.0, similarity="dot")``.
        document_regularizer_weight: lambda_d >= 0.
        query_regularizer_weight: lambda_q >= 0, or None for no query term (inference-free SPLADE, whose
            queries are not encoded by the model).
        document_regularizer, query_regularizer: callables (N, V) -> scalar; None for ``FlopsRegularizer()``
            (``L1Regularizer()`` is the other one here).

    Shapes (``forward(query, positive, negatives=None)``): query (N, V), positive (N, V), negatives optional
        (N * h, V) grouped by query, as InfoNCE's. Returns a 0-dim tensor. Each may also be given by its
        non-zeros (``gradcache.sparse_rows.SparseRows``, as GradCache's ``sparse_cache`` hands them over): with the
        default base loss (or any InfoNCE by dot product in its plain form) and the FLOPS or L1 regularisers the
        loss is computed from the non-zeros, one block of rows dense at a time (``sparse_scores.py``); with
        another, the rows are made dense first.

    Raises:
        ValueError: a weight that is negative, NaN or infinite.
        TypeError: a loss or regulariser that is not callable.

    Example:
        >>> loss_fn = SpladeLoss(document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
        >>> loss = loss_fn(torch.relu(torch.randn(8, 100)), torch.relu(torch.randn(8, 100)))
        >>> loss_fn.parts["document_regularizer_loss"]
    """

    def __init__(
        self, loss: Callable[..., torch.Tensor] | None = None, document_regularizer_weight: float = 3e-5,
        query_regularizer_weight: float | None = 5e-5, *, document_regularizer: Callable[..., torch.Tensor] | None = None,
        query_regularizer: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.document_regularizer_weight = _weight(document_regularizer_weight, "document_regularizer_weight")
        self.query_regularizer_weight = (None if query_regularizer_weight is None
                                         else _weight(query_regularizer_weight, "query_regularizer_weight"))
        for name, value in (("loss", loss), ("document_regularizer", document_regularizer),
                            ("query_regularizer", query_regularizer)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be a callable (an nn.Module loss), got {type(value).__name__}")
        self.loss = loss if loss is not None else InfoNCE(temperature=1.0, similarity="dot")
        self.document_regularizer = document_regularizer if document_regularizer is not None else FlopsRegularizer()
        self.query_regularizer = query_regularizer if query_regularizer is not None else FlopsRegularizer()
        self.parts: dict[str, torch.Tensor] = {}

    takes_sparse_rows = True  # GradCache's sparse cache hands the rows over by their non-zeros (forward)

    def forward(self, query: torch.Tensor | SparseRows, positive: torch.Tensor | SparseRows,
                negatives: torch.Tensor | SparseRows | None = None) -> torch.Tensor:
        rows = [r for r in (query, positive, negatives) if r is not None]
        if any(isinstance(r, SparseRows) for r in rows):
            temperature = plain_dot_infonce(self.loss)
            sparse_ready = all(isinstance(r, (FlopsRegularizer, L1Regularizer))
                               for r in (self.document_regularizer, self.query_regularizer))
            if temperature is not None and sparse_ready and all(isinstance(r, SparseRows) for r in rows):
                return self._from_non_zeros(query, positive, negatives, temperature)
            query, positive, negatives = (None if r is None else densify(r) if isinstance(r, SparseRows) else r
                                          for r in (query, positive, negatives))
        base = self.loss(query, positive) if negatives is None else self.loss(query, positive, negatives)
        documents = positive if negatives is None else torch.cat([positive, negatives])  # (N * (1 + h), V)
        return self._with_regularizers(base, documents, query)

    def _from_non_zeros(self, query: SparseRows, positive: SparseRows, negatives: SparseRows | None,
                        temperature: float | torch.Tensor) -> torch.Tensor:
        """The loss from the rows' non-zeros: every positive and hard negative a candidate of every query."""
        documents = positive if negatives is None else join_sparse([positive, negatives])  # (N * (1 + h), V)
        labels = torch.arange(query.size[0], device=query.values.device)  # query i's positive is row i
        return self._with_regularizers(sparse_infonce(query, documents, labels, temperature), documents, query)

    def _with_regularizers(self, base: torch.Tensor, documents: torch.Tensor | SparseRows,
                           query: torch.Tensor | SparseRows) -> torch.Tensor:
        parts = {"base_loss": base,
                 "document_regularizer_loss": self.document_regularizer_weight * self.document_regularizer(documents)}
        if self.query_regularizer_weight is not None:
            parts["query_regularizer_loss"] = self.query_regularizer_weight * self.query_regularizer(query)
        self.parts = {name: value.detach() for name, value in parts.items()}
        return sum(parts.values())

    def extra_repr(self) -> str:
        return (f"document_regularizer_weight={self.document_regularizer_weight}, "
                f"query_regularizer_weight={self.query_regularizer_weight}")


def _weight(value: object, name: str) -> float:
    weight = check_finite_number(value, name)
    if weight < 0:
        raise ValueError(f"{name} must be >= 0 (it multiplies a sparsity penalty), got {value!r}")
    return weight
