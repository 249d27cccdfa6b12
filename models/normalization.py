"""Choice of normalisation layer for the convolutional encoders (``norm="batch"|"group"``).

BatchNorm couples the examples of a batch, so under GradCache its statistics come from one chunk,
not the full batch; GroupNorm normalises each example alone and makes the chunked forward pass
exactly equal to the full-batch one. Both are offered; the choice is the caller's.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from torch import nn

from gradcache.ranges import is_int

NORMS = ("batch", "group")


def make_norm_layer(norm: str, groups: int, channel_counts: tuple[int, ...]) -> Callable[[int], nn.Module]:
    """Return ``channels -> nn.BatchNorm2d(channels)`` or ``channels -> nn.GroupNorm(groups, channels)``.

    Args:
        norm: ``"batch"`` or ``"group"``.
        groups: number of GroupNorm groups; must divide every entry of ``channel_counts``
            (ignored for ``norm="batch"``).
        channel_counts: the channel counts the caller will normalise, checked up front so that a
            bad ``groups`` fails here with a clear message rather than deep inside a constructor.

    Raises:
        ValueError: unknown ``norm``, or ``groups`` not positive or not dividing a channel count.
    """
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is not supported; choose one of {NORMS}.")
    if norm == "batch":
        return nn.BatchNorm2d
    if not is_int(groups, 1):
        raise ValueError(f"groups={groups!r} must be a positive int (the number of GroupNorm groups).")
    bad = [channels for channels in channel_counts if channels % groups]
    if bad:
        raise ValueError(
            f"groups={groups} does not divide the channel counts {bad}; "
            f"choose a divisor of {min(channel_counts)}."
        )
    return partial(nn.GroupNorm, groups)
