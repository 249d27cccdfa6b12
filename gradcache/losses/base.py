"""What every gradcache loss shares: its temperature, its tiles, its queues, its repr and its negatives count.

    t > 0 (fixed, or learned as logit_scale = log(1 / t));  tiles of tile_size x column_tile_size;  queue_size Q

A loss derives from ``LossBase`` (one level, no deeper), passes these options to ``LossBase.__init__``, declares
the attributes that hold its queues (``queue_names``) and the hyperparameters its repr shows (``hyperparameters``),
and says how many negatives each anchor meets (``negatives_per_anchor``). The rest (its formula, its forward,
dense and tiled) stays in its own file.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from typing import ClassVar

import torch
from torch import nn

from gradcache.ranges import check_int

from .checks import check_column_tile_size, check_temperature, check_tile_size
from .queue import make_queue

__all__ = ["LossBase", "check_counts"]


class LossBase(nn.Module, metaclass=ABCMeta):
    """A contrastive loss over (N, D) embeddings: temperature t, optional tiles, optional queues of past rows.

        fixed t:    ``temperature`` = t, a float
        learned t:  ``logit_scale`` = log(1 / t), an ``nn.Parameter`` (``learnable=True``) or a buffer

    Args:
        temperature: t > 0; kept as the float ``temperature`` when ``learnable`` is None, else as ``logit_scale``
            (the subclass then reads ``temperature`` back from it).
        tile_size: None for dense logits; an int >= 1 for tiles of that many rows (see each loss).
        column_tile_size: columns per tile, with ``tile_size`` set; None for square tiles.
        queue_size: 0 for in-batch negatives only; Q > 0 for one ``EmbeddingQueue`` of Q rows in each attribute
            that ``queue_names`` lists (None there when Q = 0). See ``queue.py``.
        queue_warmup: calls with gradients before the queues are read or filled; needs Q > 0.
        learnable: None for a fixed temperature; a bool to store ``logit_scale`` as a parameter (True) or a
            buffer (False), as CLIP and SigLIP do; kept as ``learnable``.

    Raises:
        ValueError: temperature <= 0, bad tile_size or column_tile_size, queue_size or queue_warmup < 0.
        TypeError: a non-int queue_size or queue_warmup.

    Example:
        >>> class MyLoss(LossBase):
        ...     hyperparameters = ("temperature", "tile_size", "column_tile_size", "queue_size")
        ...     def negatives_per_anchor(self, seen, hard_negatives=0): return seen - 1
        >>> MyLoss(temperature=0.1, tile_size=None, column_tile_size=None, queue_size=0, queue_warmup=0)
        MyLoss(temperature=0.1, tile_size=None, column_tile_size=None, queue_size=0)
    """

    hyperparameters: ClassVar[tuple[str, ...]] = ()  # the attributes ``extra_repr`` shows, in this order
    queue_names: ClassVar[tuple[str, ...]] = ("queue",)  # the attributes holding the loss's queues

    def __init__(self, temperature: float, *, tile_size: int | None, column_tile_size: int | None, queue_size: int,
                 queue_warmup: int, learnable: bool | None = None) -> None:
        super().__init__()
        temperature = check_temperature(temperature)
        self.tile_size = check_tile_size(tile_size)
        self.column_tile_size = check_column_tile_size(column_tile_size, self.tile_size)
        for name in self.queue_names:  # make_queue checks both options before the first queue exists
            setattr(self, name, make_queue(queue_size, queue_warmup))
        self.queue_size = queue_size
        if learnable is None:
            self.temperature = temperature
        else:
            self.learnable = bool(learnable)
            self.register_scalar("logit_scale", math.log(1.0 / temperature))

    def register_scalar(self, name: str, value: float) -> None:
        """Register the 0-dim ``value`` as parameter ``name`` if ``self.learnable``, else as a buffer (saved alike)."""
        tensor = torch.tensor(value)
        if self.learnable:
            self.register_parameter(name, nn.Parameter(tensor))
        else:
            self.register_buffer(name, tensor)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={_shown(getattr(self, name))}" for name in self.hyperparameters)

    @abstractmethod
    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """Negatives each anchor meets in one call on ``seen`` examples with h hard negatives each, queue aside.

        A full queue adds ``queue_size`` (``gradcache.negatives_per_anchor`` adds it; ``queue.queued_negatives``
        counts the queue as it fills).

        Raises:
            ValueError: seen < 1, hard_negatives < 0, hard negatives for a loss that takes none.
        """


def check_counts(loss: nn.Module, seen: object, hard_negatives: object, takes_hard_negatives: bool) -> None:
    """Raise ValueError unless ``seen`` is an int >= 1 and ``hard_negatives`` an int >= 0 that ``loss`` takes."""
    check_int(seen, "seen", meaning="the examples one call of the loss sees")
    check_int(hard_negatives, "hard_negatives", at_least=0)
    if hard_negatives and not takes_hard_negatives:
        raise ValueError(
            f"hard_negatives={hard_negatives} needs loss 'infonce'; {type(loss).__name__} takes none."
        )


def _shown(value: object) -> str:
    """``repr(value)``; a float or 0-dim tensor to 4 significant digits, hiding a learned value's rounding noise."""
    if isinstance(value, torch.Tensor):
        value = float(value.detach())
    if isinstance(value, float):
        return repr(float(f"{value:.4g}"))
    return repr(value)
