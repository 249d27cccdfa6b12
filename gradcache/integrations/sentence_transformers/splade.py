"""GradCacheSpladeLoss: GradCache as sentence-transformers' `CachedSpladeLoss`, for `SparseEncoderTrainer`."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from sentence_transformers.sparse_encoder.losses import SpladeLoss as _PeerSpladeLoss

from gradcache.integrations.sentence_transformers.loss import GradCacheLoss, _columns_to_loss, backward_into
from gradcache.integrations.sentence_transformers.spellings import count_of, temperature_of
from gradcache.losses import FlopsRegularizer, L1Regularizer
from gradcache.losses.sparse_scores import plain_dot_infonce, sparse_infonce
from gradcache.options import Options, Unpack
from gradcache.sparse_rows import SparseRows, densify, join_sparse


class _SpladeMark(_PeerSpladeLoss):
    """Makes `isinstance(loss, SpladeLoss)` true, which is how `SparseEncoderTrainer` decides to add its
    `SpladeRegularizerWeightSchedulerCallback` (the regulariser weights' warm-up) and how that callback accepts the
    loss; the peer's `__init__` is skipped, `GradCacheSpladeLoss` sets the attributes the callback reads."""

    def __init__(self) -> None:
        nn.Module.__init__(self)


class GradCacheSpladeLoss(GradCacheLoss, _SpladeMark):
    """SPLADE's loss over the whole batch at the memory of one chunk: base(q, p, n) + lambda_d * R_d([p; n]) +
    lambda_q * R_q(q), the encoder passes chunked by GradCache, the loss and regularisers over the full batch.

    A drop-in for sentence-transformers' `CachedSpladeLoss(model, loss, document_regularizer_weight,
    query_regularizer_weight, mini_batch_size=...)`: equal to its uncached `SpladeLoss` in value, parts and
    gradient; returns what it returns, the parts `{"base_loss", "document_regularizer_loss",
    "query_regularizer_loss"}` (weighted; the last absent when `query_regularizer_weight` is None; no total key),
    whose sum carries the gradient. It is a `SpladeLoss` to `SparseEncoderTrainer`, which adds its
    regulariser-weight warm-up callback as it does for the peer's. Defaults as `CachedSpladeLoss`'s: chunks of
    32 rows, each chunk's trailing padding trimmed; unlike it, the cache between the two passes holds each
    row's non-zeros only (`sparse_cache`), not (N, V) dense rows, and with the default base loss and
    regularisers phase (2) is computed from them too (gradcache/losses/sparse_scores.py).

    Args:
        model: the SparseEncoder being trained.
        loss: the base loss: a sentence-transformers sparse loss with `compute_loss_from_embeddings`
            (`SparseMultipleNegativesRankingLoss(model)`), or a loss of this library (`InfoNCE(temperature=1.0,
            similarity="dot")`), called on the columns as `GradCacheLoss` calls it.
        document_regularizer_weight: lambda_d, on every positive and hard-negative row.
        query_regularizer_weight: lambda_q, on the anchors; None for none (inference-free SPLADE).
        chunk_size, mini_batch_size: rows per chunk, either spelling (default 32).
        temperature, scale: the base loss's temperature, either spelling (scale = 1 / temperature); set on the
            loss when given (its `scale` or `temperature` attribute); default: the loss's own.
        document_regularizer, query_regularizer: callables (N, V) -> scalar, or modules with
            `compute_loss_from_embeddings` (sentence-transformers' `FlopsLoss`); None for
            `gradcache.losses.FlopsRegularizer(threshold)`.
        document_regularizer_threshold, query_regularizer_threshold: the default FLOPS's `threshold`.
        use_document_regularizer_only: every column is a document, regularised with lambda_d; no query term.
        sparse_cache: keep the cached rows and their gradients by their non-zeros (default True: a SparseEncoder's
            SPLADE rows are 0 only where its relu clamps them, so this is exact; `gradcache.sparse_rows`); a
            model whose rows hold negative values is refused at the call (ValueError): pass False for it.
        trim_padding, gather_across_devices, show_progress_bar, **options: as for `GradCacheLoss`.

    Raises:
        ValueError: `chunk_size` and `mini_batch_size` (or `temperature` and `scale`) given with different
            meanings; a chunk size below 1; a temperature or scale that is not a finite number > 0; a weight < 0;
            a threshold beside its regulariser.
        TypeError: a chunk size that is not an int; a temperature or scale for a loss that has neither attribute;
            bad options as `GradCacheLoss`.

    Example:
        >>> loss = GradCacheSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 3e-5, 5e-5, chunk_size=32)
        >>> SparseEncoderTrainer(model=model, train_dataset=pairs, loss=loss).train()
    """

    def __init__(
        self, model: nn.Module, loss: nn.Module, document_regularizer_weight: float,
        query_regularizer_weight: float | None = None, chunk_size: int | None = None, *,
        mini_batch_size: int | None = None, temperature: float | None = None, scale: float | None = None,
        document_regularizer: nn.Module | None = None, query_regularizer: nn.Module | None = None,
        document_regularizer_threshold: int | None = None, query_regularizer_threshold: int | None = None,
        use_document_regularizer_only: bool = False, sparse_cache: bool = True, trim_padding: bool = True,
        gather_across_devices: bool = False, show_progress_bar: bool = False, **options: Unpack[Options],
    ) -> None:
        if not isinstance(loss, nn.Module) or not callable(loss):
            raise TypeError(
                f"loss must be the base loss module (SparseMultipleNegativesRankingLoss(model), or InfoNCE), got "
                f"{type(loss).__name__}"
            )
        owner = type(self).__name__
        chunks = count_of(owner, "chunk_size", chunk_size, "mini_batch_size", mini_batch_size, 32)
        base_temperature = temperature_of(owner, temperature, scale, None)
        if base_temperature is not None and not hasattr(loss, "scale") \
                and not isinstance(getattr(loss, "temperature", None), float):
            raise TypeError(
                f"temperature/scale was given but the base loss {type(loss).__name__} has neither a `scale` nor a "
                "fixed `temperature` attribute to set: configure the loss itself and drop temperature/scale"
            )
        weights = {"document_regularizer_weight": document_regularizer_weight,
                   "query_regularizer_weight": query_regularizer_weight}
        for name, weight in weights.items():
            if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0):
                raise ValueError(f"{name} must be a number >= 0, got {weight!r}")
        if document_regularizer_weight is None:
            raise ValueError("document_regularizer_weight must be a number >= 0, got None")
        for name, given, threshold in (("document_regularizer", document_regularizer, document_regularizer_threshold),
                                       ("query_regularizer", query_regularizer, query_regularizer_threshold)):
            if given is not None and threshold is not None:
                raise ValueError(
                    f"{name}_threshold={threshold!r} applies to the default FLOPS regulariser only, but {name} was "
                    f"given too: pass the threshold to your regulariser, or drop {name}"
                )
        super().__init__(model, loss, chunks, trim_padding=trim_padding, gather_across_devices=gather_across_devices,
                         show_progress_bar=show_progress_bar, sparse_cache=sparse_cache, **options)
        if base_temperature is not None:  # after every check: nothing is changed on a refused call
            if hasattr(loss, "scale"):
                loss.scale = scale if scale is not None else 1.0 / base_temperature
            else:
                loss.temperature = base_temperature
        self.document_regularizer_weight = float(document_regularizer_weight)
        self.use_document_regularizer_only = use_document_regularizer_only
        self.query_regularizer_weight = (None if query_regularizer_weight is None or use_document_regularizer_only
                                         else float(query_regularizer_weight))
        self.document_regularizer = (document_regularizer if document_regularizer is not None
                                     else FlopsRegularizer(document_regularizer_threshold))
        self.query_regularizer = (query_regularizer if query_regularizer is not None
                                  else FlopsRegularizer(query_regularizer_threshold))
        self.parts: dict[str, torch.Tensor] = {}

    def forward(
        self, sentence_features: Iterable[Mapping[str, Any]], labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The parts, as `CachedSpladeLoss` returns them: the first holds the gradient of the whole loss, so
        that the trainer's sum of the values is the loss and back-propagates it (phase (3) runs there)."""
        total = GradCacheLoss.forward(self, sentence_features, labels)
        parts = dict(self.parts)
        first = next(iter(parts))
        others = sum((value for name, value in parts.items() if name != first), torch.zeros_like(total))
        parts[first] = total - others
        return parts

    def _phase_two(self, *embeddings: torch.Tensor | SparseRows, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Phase (2) from the rows' non-zeros (the sparse cache's, gradcache/losses/sparse_scores.py) where the base
        loss is InfoNCE by dot product in its plain form (`SparseMultipleNegativesRankingLoss`'s defaults, or this
        library's `InfoNCE(similarity="dot")`) and the regularisers FLOPS or L1; else through `calculate_loss` on
        the rows made dense, as the peer computes it."""
        temperature = plain_dot_infonce(self.loss)
        regularizers = (self.document_regularizer, self.query_regularizer)
        if temperature is None or not all(isinstance(r, (FlopsRegularizer, L1Regularizer)) for r in regularizers) \
                or not all(isinstance(e, SparseRows) for e in embeddings):
            dense = [densify(e) if isinstance(e, SparseRows) else e for e in embeddings]
            return GradCacheLoss._phase_two(self, *dense, labels=labels)
        query, documents = embeddings[0], join_sparse(list(embeddings[1:]))  # (N, V), (N * (1 + h), V)
        labels_of_rows = torch.arange(query.size[0], device=query.values.device)  # query i's positive: row i
        regularized = join_sparse(list(embeddings)) if self.use_document_regularizer_only else documents
        parts = {"base_loss": sparse_infonce(query, documents, labels_of_rows, temperature),
                 "document_regularizer_loss": self.document_regularizer_weight
                 * self.document_regularizer(regularized)}
        if self.query_regularizer_weight is not None:
            parts["query_regularizer_loss"] = self.query_regularizer_weight * self.query_regularizer(query)
        self.parts = {name: value.detach() for name, value in parts.items()}
        return sum(parts.values())

    _phase_two.takes_sparse_rows = True  # GradCache hands the sparse cache's rows over as they are

    def calculate_loss(
        self, reps: list[list[torch.Tensor]], labels: torch.Tensor | None = None, *, with_backward: bool = False
    ) -> torch.Tensor:
        """Phase (2): the base loss and the weighted regularisers over the full batch from `reps`, one list of
        (rows, V) embeddings per column; the parts are kept in `self.parts`, detached."""
        columns = [torch.cat(column) for column in reps]  # (N, V) each
        if hasattr(self.loss, "compute_loss_from_embeddings"):
            base = self.loss.compute_loss_from_embeddings(columns, labels)
        else:
            base = _columns_to_loss(self.loss, *columns)
        parts = dict(base) if isinstance(base, dict) else {"base_loss": base}
        documents = torch.cat(columns if self.use_document_regularizer_only else columns[1:])  # (N * (1 + h), V)
        parts["document_regularizer_loss"] = self.document_regularizer_weight * _regularize(
            self.document_regularizer, documents)
        if self.query_regularizer_weight is not None:
            parts["query_regularizer_loss"] = self.query_regularizer_weight * _regularize(
                self.query_regularizer, columns[0])
        self.parts = {name: value.detach() for name, value in parts.items()}
        return backward_into(sum(parts.values()), reps, self.loss, with_backward)

    def get_config_dict(self) -> dict[str, Any]:
        return {**GradCacheLoss.get_config_dict(self), "document_regularizer_weight": self.document_regularizer_weight,
                "query_regularizer_weight": self.query_regularizer_weight,
                "use_document_regularizer_only": self.use_document_regularizer_only}

    @property
    def citation(self) -> str:
        return GradCacheLoss.citation.fget(self) + "\n" + (
            "@misc{formal2022distillationhardnegativesampling, title={From Distillation to Hard Negative Sampling: "
            "Making Sparse Neural IR Models More Effective}, author={Formal, Thibault and Lassance, Carlos and "
            "Piwowarski, Benjamin and Clinchant, St\\'ephane}, year={2022}, eprint={2205.04733}}"
        )


def _regularize(regularizer: Any, rows: torch.Tensor) -> torch.Tensor:
    if hasattr(regularizer, "compute_loss_from_embeddings"):
        return regularizer.compute_loss_from_embeddings(rows)
    return regularizer(rows)
