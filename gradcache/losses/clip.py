"""CLIP's symmetric contrastive loss with a learned logit scale."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import LossBase, check_counts
from .checks import check_embeddings, check_same_rows, check_temperature
from .precision import compute_dtype, full_precision, unit_rows
from .queue import EmbeddingQueue, QueuePair
from .tiled_logsumexp import tiled_logsumexp

__all__ = ["ClipLoss"]


class ClipLoss(LossBase):
    """Mean of the image-to-text and text-to-image cross-entropies over the batch, pair i the target of row i.

    L = 1/2 (CE(s I T^T, diag) + CE(s T I^T, diag)),  s = exp(logit_scale) = 1 / t, on unit vectors.

    Paper: Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision",
    https://arxiv.org/abs/2103.00020.

    Args:
        temperature: initial t > 0; stored as ``logit_scale = log(1 / t)``.
        learnable: make ``logit_scale`` an ``nn.Parameter`` (else a buffer). Call ``clamp_logit_scale()``
            after each optimizer step, as CLIP does; clamping inside forward would zero its gradient.
        tile_size: None for the dense (N, N) logits; an int to compute forward and backward in tiles of that
            many rows, memory O(tile_size * column_tile_size + N) above the embeddings and their gradients,
            same value and gradients (``logit_scale`` included).
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles of ``tile_size``.
            At least the column count gives strips of ``tile_size`` rows against every column.
        queue_size: 0 for in-batch negatives only; Q > 0 to keep the last Q image and the last Q text rows of
            earlier calls, detached, in two queues: each image is scored against the batch's captions and the
            text queue, each caption against the batch's images and the image queue (Q more negatives per
            anchor once full). It advances once per call with gradients on and a finite loss: once per step
            under GradCache, CachedLoss and FullBatch, once per micro-batch under NaiveAccumulation. Tiled with
            a queue, the two directions are two passes over the blocks (twice the loss's compute). See
            ``gradcache/losses/queue.py``.
        queue_warmup: calls with gradients before the queues are read or filled (XBM's warm-up); needs Q > 0.

    Shapes (``forward``):
        image: (N, D); text: (N, D), row i the caption of image i.
        Returns a 0-dim tensor in float32 (float64 for float64 inputs).

    Raises:
        ValueError: temperature <= 0, bad tile_size or column_tile_size, mismatched N or D, NaN/inf entries,
            queue_size or queue_warmup < 0, a batch whose width differs from the queues'.
        TypeError: a non-tensor or non-floating input, a non-int queue_size or queue_warmup.

    Example:
        >>> loss_fn = ClipLoss(temperature=0.07)
        >>> image, text = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(image, text)
    """

    hyperparameters = ("temperature", "learnable", "tile_size", "column_tile_size", "queue_size")
    queue_names = ("image_queue", "text_queue")
    image_queue: EmbeddingQueue | None  # set by LossBase from queue_size, as text_queue; see ``queues``
    text_queue: EmbeddingQueue | None
    logit_scale: torch.Tensor  # log(1 / t), set by LossBase: a parameter if learnable, else a buffer

    def __init__(self, temperature: float = 0.07, *, learnable: bool = True, tile_size: int | None = None,
                 column_tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0) -> None:
        super().__init__(temperature, tile_size=tile_size, column_tile_size=column_tile_size, queue_size=queue_size,
                         queue_warmup=queue_warmup, learnable=learnable)

    @property
    def queues(self) -> QueuePair:
        """``image_queue`` and ``text_queue`` as one ``QueuePair`` (first: images; both None without a queue)."""
        return QueuePair(self.image_queue, self.text_queue)

    @property
    def temperature(self) -> float:
        """The current temperature, 1 / exp(logit_scale)."""
        return float(torch.exp(-self.logit_scale.detach()))

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """n - 1: each image against every caption but its own, each caption against every other image."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=False)
        return seen - 1

    @torch.no_grad()
    def clamp_logit_scale(self, max_scale: float = 100.0) -> None:
        """Clamp exp(logit_scale) to at most ``max_scale`` in place (temperature >= 1 / max_scale)."""
        max_scale = check_temperature(max_scale, name="max_scale")
        self.logit_scale.clamp_(max=math.log(max_scale))

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        check_embeddings(image=image, text=text)
        n = check_same_rows(image=image, text=text)
        dtype = compute_dtype(image, text)
        image, text = image.to(dtype), text.to(dtype)
        queues = self.queues
        queued_images, queued_texts = queues.contents(image, text)  # (Q', D) each, or None
        with full_precision(image.device):
            scale = self.logit_scale.to(dtype).exp()
            if queued_images is None:
                loss = self._in_batch(image, text, scale, n)
            else:
                loss = (self._one_way(image, [text, queued_texts], scale, n)
                        + self._one_way(text, [image, queued_images], scale, n)) / 2
        queues.push(loss, image, text)
        return loss

    def _in_batch(self, image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
        labels = torch.arange(n, device=image.device)
        if self.tile_size is None:
            logits = unit_rows(image, image.dtype) @ unit_rows(text, text.dtype).T * scale  # (N, N): image, caption
            return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        # Row i: image i against every caption; column j: caption j against every image (normalised inside).
        image_losses, text_losses = tiled_logsumexp(
            [image], [text], scale, labels, self.tile_size, self.column_tile_size, with_columns=True)
        return (image_losses.mean() + text_losses.mean()) / 2

    def _one_way(self, anchors: torch.Tensor, columns: list[torch.Tensor], scale: torch.Tensor,
                 n: int) -> torch.Tensor:
        """CE of each anchor against [the other side's batch; its queue], target its own pair."""
        labels = torch.arange(n, device=anchors.device)
        if self.tile_size is None:
            candidates = torch.cat([unit_rows(c, c.dtype) for c in columns])  # (N + Q', D)
            return F.cross_entropy(unit_rows(anchors, anchors.dtype) @ candidates.T * scale, labels)  # (N, N + Q')
        losses, _ = tiled_logsumexp([anchors], columns, scale, labels, self.tile_size, self.column_tile_size)
        return losses.mean()
