"""SPLADE's loss: an in-batch ranking loss over sparse vocabulary-sized rows plus weighted sparsity regularisers."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .checks import check_finite_number
from .infonce import InfoNCE
from .sparsity import FlopsRegularizer

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
        (N * h, V) grouped by query, as InfoNCE's. Returns a 0-dim tensor.

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

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        base = self.loss(query, positive) if negatives is None else self.loss(query, positive, negatives)
        documents = positive if negatives is None else torch.cat([positive, negatives])  # (N * (1 + h), V)
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
