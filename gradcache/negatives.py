"""How many negatives each anchor of a step is contrasted against: the figure a large batch exists for.

negatives = 2 n - 2 (NT-Xent: 2n views, all but itself and its positive), n - 1 (CLIP, SigLIP: the other
captions), n (1 + h) - 1 (InfoNCE with h hard negatives per query: every candidate of the batch but the
positive), where n is what the loss sees at once: the global batch for GradCache and FullBatch, one
micro-batch gathered over the ranks for NaiveAccumulation. Each loss states its own formula as its
``negatives_per_anchor(seen, hard_negatives)`` method (InfoNCE's follows its ``directions``); this module only
works out n from the strategy. A full queue of Q past embeddings (``queue_size``) adds Q to each: every anchor
meets every queued row of its candidate side. A ``Matryoshka`` loss counts as its inner loss: every dimension
contrasts each anchor with the same negatives.
"""
from __future__ import annotations

from typing import Protocol

from torch import nn

from gradcache.ranges import check_int
from gradcache.registry import LOSSES, STRATEGIES, name_of


class CountsNegatives(Protocol):
    """A loss that says how many negatives each anchor meets in one call on ``seen`` examples (queue aside)."""

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int: ...


def _counting_loss(loss: object) -> CountsNegatives:
    """A loss instance whose ``negatives_per_anchor`` method counts: ``loss`` itself when it has one (any
    instance of gradcache's losses, ``Matryoshka`` included), else the default instance of the named class."""
    if not isinstance(loss, type) and callable(getattr(loss, "negatives_per_anchor", None)):
        return loss  # type: ignore[return-value]  # duck-typed: it has the method
    return LOSSES[name_of(loss, LOSSES, "loss")]()


def negatives_per_anchor(
    strategy: str | type | object,
    loss: str | type | nn.Module,
    batch_size: int,
    chunk_size: int | None,
    world_size: int = 1,
    hard_negatives: int = 0,
    queue_size: int = 0,
) -> int:
    """Negatives per anchor in one step: 2n - 2 (NT-Xent), n - 1 (CLIP, SigLIP), n (1 + h) - 1 (InfoNCE), + Q.

    Args:
        strategy: "gradcache", "cached_loss", "full" or "naive" (or the class, or an instance).
        loss: "ntxent", "clip", "siglip" or "infonce" (or the class: their defaults count), or an instance
            (its ``negatives_per_anchor`` method counts: an InfoNCE's follows its directions; a ``Matryoshka``
            asks its inner loss).
        batch_size: the global batch: examples (pairs, images) summed over every rank.
        chunk_size: examples per chunk on one rank; only "naive" reads it (its loss sees one micro-batch of
            every rank), None meaning the whole per-rank batch.
        world_size: ranks that share the batch (the strategies gather every rank's embeddings).
        hard_negatives: h, hard negatives per query (InfoNCE only).
        queue_size: Q, the loss's ``queue_size``, counted full: the first calls (until Q rows have been
            enqueued) and those of the warm-up see fewer.

    Raises:
        ValueError: an unknown strategy or loss, a batch that the ranks cannot share, a size below 1, hard
            negatives with a loss other than InfoNCE, or a negative queue_size.
        TypeError: a ``Matryoshka`` whose inner loss has no ``negatives_per_anchor`` method.

    Example:
        >>> negatives_per_anchor("naive", "ntxent", batch_size=128, chunk_size=32)
        62
        >>> negatives_per_anchor("naive", "ntxent", batch_size=128, chunk_size=32, queue_size=4096)
        4158
    """
    strategy_name = name_of(strategy, STRATEGIES, "strategy")
    counting = _counting_loss(loss)
    check_int(batch_size, "batch_size")
    check_int(world_size, "world_size")
    check_int(chunk_size, "chunk_size", optional="the whole batch")
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not shared evenly by {world_size} ranks; give a multiple.")
    check_int(hard_negatives, "hard_negatives", at_least=0)
    check_int(queue_size, "queue_size", at_least=0, meaning="0: no queue")
    local = batch_size // world_size
    seen = batch_size
    if strategy_name == "naive":
        seen = min(chunk_size or local, local) * world_size  # one micro-batch of every rank
    return counting.negatives_per_anchor(seen, hard_negatives) + queue_size  # raises for unwanted hard negatives
