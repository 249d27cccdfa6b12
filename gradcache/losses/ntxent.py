"""NT-Xent, SimCLR's normalised temperature-scaled cross-entropy over the 2N views of N examples."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase, check_counts
from .checks import check_embeddings, check_same_rows
from .precision import compute_dtype, full_precision, unit_rows
from .queue import EmbeddingQueue
from .tiled_logsumexp import tiled_logsumexp

__all__ = ["NTXent"]


class NTXent(LossBase):
    """Cross-entropy of each of the 2N views against the other 2N - 1, its other view being the target.

    L = -1/(2N) sum_k log( exp(z_k.z_k+ / t) / sum_{j != k} exp(z_k.z_j / t) ), z = [z1; z2] on unit vectors.

    Paper: Chen et al. 2020, "A Simple Framework for Contrastive Learning", https://arxiv.org/abs/2002.05709.

    Args:
        temperature: t > 0; divides the cosine similarity.
        tile_size: None for the dense (2N, 2N) logits; an int to compute forward and backward in tiles of that
            many views, memory O(tile_size * column_tile_size + N) above the embeddings and their gradients,
            same value and gradients.
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles of ``tile_size``.
            At least 2N gives strips of ``tile_size`` rows against every column.
        queue_size: 0 for in-batch negatives only; Q > 0 to keep the last Q views (both views of each example)
            of earlier calls, detached, as extra negatives of every view: sum_q exp(z_k.m_q / t) joins each
            denominator. It advances (by 2N rows) once per call with gradients on and a finite loss: once per
            step under GradCache, CachedLoss and FullBatch, once per micro-batch under NaiveAccumulation. See
            ``gradcache/losses/queue.py``.
        queue_warmup: calls with gradients before the queue is read or filled (XBM's warm-up); needs Q > 0.

    Shapes (``forward``):
        z1: (N, D), one view per example; z2: (N, D), row i the other view of row i of ``z1``.
        Returns a 0-dim tensor in float32 (float64 for float64 inputs).

    Raises:
        ValueError: temperature <= 0, bad tile_size or column_tile_size, mismatched N or D, NaN/inf entries,
            queue_size or queue_warmup < 0, a batch whose width differs from the queue's.
        TypeError: a non-tensor or non-floating input, a non-int queue_size or queue_warmup.

    Example:
        >>> loss_fn = NTXent(temperature=0.5)
        >>> z1, z2 = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(z1, z2)
    """

    hyperparameters = ("temperature", "tile_size", "column_tile_size", "queue_size")
    queue: EmbeddingQueue | None  # set by LossBase from queue_size

    def __init__(
        self, temperature: float = 0.5, *, tile_size: int | None = None, column_tile_size: int | None = None,
        queue_size: int = 0, queue_warmup: int = 0,
    ) -> None:
        super().__init__(temperature, tile_size=tile_size, column_tile_size=column_tile_size, queue_size=queue_size,
                         queue_warmup=queue_warmup)

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """2n - 2: each of the 2n views against every view but itself and its positive (queue aside)."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=False)
        return 2 * seen - 2

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        check_embeddings(z1=z1, z2=z2)
        n = check_same_rows(z1=z1, z2=z2)
        dtype = compute_dtype(z1, z2)
        views = [z1.to(dtype), z2.to(dtype)]
        queued = None if self.queue is None else self.queue.contents(views[0])  # (Q', D), constants
        with full_precision(z1.device):
            scale = 1.0 / self.temperature
            # View k < N pairs with k + N and the other way round.
            targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z1.device)  # (2N,)
            columns = views if queued is None else [*views, queued]
            if self.tile_size is None:
                rows = torch.cat([unit_rows(v, dtype) for v in views])  # (2N, D)
                candidates = rows if queued is None else torch.cat([rows, unit_rows(queued, dtype)])  # (2N + Q', D)
                logits = rows @ candidates.T * scale  # (2N, 2N + Q')
                self_pairs = torch.eye(2 * n, logits.shape[1], dtype=torch.bool, device=rows.device)
                loss = F.cross_entropy(logits.masked_fill(self_pairs, float("-inf")), targets)
            else:
                scale_tensor = torch.tensor(scale, dtype=dtype, device=z1.device)
                # The 2N views [z1; z2] as rows, [z1; z2; queue] as columns, stacked and normalised tile by tile.
                view_losses, _ = tiled_logsumexp(views, columns, scale_tensor, targets, self.tile_size,
                                                 self.column_tile_size, exclude_diagonal=True)
                loss = view_losses.mean()
        if self.queue is not None:
            self.queue.push(loss, *views)
        return loss
