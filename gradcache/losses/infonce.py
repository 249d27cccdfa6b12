"""InfoNCE with in-batch and hard negatives: the loss of dense retrieval (DPR) and sentence embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_column_tile_size, check_embeddings, check_same_rows, check_temperature, check_tile_size
from .precision import compute_dtype, full_precision, unit_rows
from .queue import make_queue
from .tiled_logsumexp import tiled_logsumexp

__all__ = ["InfoNCE"]


class InfoNCE(nn.Module):
    """Cross-entropy of each query against every positive and hard negative in the batch, its own positive the target.

    L = -1/N sum_i log( exp(q_i.p_i / t) / (sum_j exp(q_i.p_j / t) + sum_k exp(q_i.n_k / t)) ), on unit vectors.

    Paper: van den Oord et al. 2018, https://arxiv.org/abs/1807.03748 (with DPR's in-batch and hard negatives,
    Karpukhin et al. 2020, https://arxiv.org/abs/2004.04906).

    Args:
        temperature: t > 0; divides the cosine similarity.
        symmetric: also score each positive against all queries (target: its own query) and average the two
            directions; hard negatives take part only in the query-to-positive direction.
        tile_size: None for the dense (N, N * (1 + h)) logits; an int to compute forward and backward in tiles
            of that many queries, memory O(tile_size * column_tile_size + N * (1 + h)) above the embeddings and
            their gradients, same value and gradients.
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles of ``tile_size``.
            At least N * (1 + h) gives strips of ``tile_size`` rows against every column.
        queue_size: 0 for in-batch negatives only; Q > 0 to keep the last Q candidate rows (positives and hard
            negatives) of earlier calls, detached, as extra negatives of every query: sum_k over the queue joins
            the denominator (not the positive-to-query direction of ``symmetric``). It advances once per call
            with gradients on and a finite loss: once per step under GradCache, CachedLoss and FullBatch, once
            per micro-batch under NaiveAccumulation. See ``gradcache/losses/queue.py``.
        queue_warmup: calls with gradients before the queue is read or filled (XBM's warm-up); needs Q > 0.

    Shapes (``forward``):
        query: (N, D); positive: (N, D), row i is the positive of query i; negatives: optional (N * h, D),
        h hard negatives per query, rows i*h .. i*h+h-1 belonging to query i (every query sees all of them).
        Returns a 0-dim tensor in float32 (float64 for float64 inputs).

    Raises:
        ValueError: temperature <= 0, bad tile_size or column_tile_size, mismatched N or D, NaN/inf entries, a
            negatives row count that is not a multiple of N, queue_size or queue_warmup < 0, or a batch whose
            width differs from the queue's. TypeError: a non-tensor or non-floating input, a non-int queue_size.

    Example:
        >>> loss_fn = InfoNCE(temperature=0.05)
        >>> query, positive = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(query, positive)
    """

    def __init__(
        self, temperature: float = 0.05, symmetric: bool = False, tile_size: int | None = None,
        column_tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.symmetric = bool(symmetric)
        self.tile_size = check_tile_size(tile_size)
        self.column_tile_size = check_column_tile_size(column_tile_size, self.tile_size)
        self.queue = make_queue(queue_size, queue_warmup)
        self.queue_size = queue_size

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, symmetric={self.symmetric}, tile_size={self.tile_size}, "
                f"column_tile_size={self.column_tile_size}, queue_size={self.queue_size}")

    def forward(
        self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = {"query": query, "positive": positive}
        if negatives is not None:
            inputs["negatives"] = negatives
        check_embeddings(**inputs)
        n = check_same_rows(query=query, positive=positive)
        if negatives is not None and negatives.shape[0] % n != 0:
            raise ValueError(
                f"negatives has {negatives.shape[0]} rows, not a multiple of the {n} queries; pass h hard "
                f"negatives per query as an (N * h, D) tensor grouped by query"
            )
        dtype = compute_dtype(*inputs.values())
        with full_precision(query.device):
            scale = 1.0 / self.temperature
            # The candidates [positive; negatives; queue] stay apart: the tiled function stacks them tile by tile.
            candidates = [t.to(dtype) for t in inputs.values()][1:]
            queued = None if self.queue is None else self.queue.contents(candidates[0])  # (Q', D), constants
            columns = candidates if queued is None else [*candidates, queued]
            if self.tile_size is None:
                loss = self._dense(unit_rows(query, dtype), torch.cat([unit_rows(c, dtype) for c in columns]),
                                   scale, n)  # candidates (N(1+h) + Q', D)
            else:
                loss = self._tiled(query.to(dtype), columns, scale)
        if self.queue is not None:
            self.queue.push(loss, *candidates)
        return loss

    def _dense(self, q: torch.Tensor, candidates: torch.Tensor, scale: float, n: int) -> torch.Tensor:
        logits = q @ candidates.T * scale  # (N, N * (1 + h)); column i is the positive of row i
        labels = torch.arange(n, device=q.device)
        loss = F.cross_entropy(logits, labels)
        if self.symmetric:
            # Positive j against all queries: column j of the query-positive block, read as a row.
            loss = (loss + F.cross_entropy(logits[:, :n].T, labels)) / 2  # (N, N)
        return loss

    def _tiled(self, query: torch.Tensor, candidates: list[torch.Tensor], scale: float) -> torch.Tensor:
        scale_tensor = torch.tensor(scale, dtype=query.dtype, device=query.device)
        targets = torch.arange(query.shape[0], device=query.device)
        # Column j < N is positive j scored against every query; hard negatives have no column term.
        query_losses, positive_losses = tiled_logsumexp(
            [query], candidates, scale_tensor, targets, self.tile_size, self.column_tile_size,
            with_columns=self.symmetric,
        )
        loss = query_losses.mean()
        if positive_losses is not None:
            loss = (loss + positive_losses.mean()) / 2
        return loss
