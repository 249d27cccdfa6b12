"""`--matryoshka-dims D1,D2,...` (every mode): the mode's loss summed over nested column prefixes of its
embeddings, each with weight 1 (Matryoshka representation learning, Kusupati et al. 2022,
https://arxiv.org/abs/2205.13147):

    L = sum_k loss(e_1[:, :d_k], e_2[:, :d_k], ...),   d_1 > d_2 > ... >= 1,  d_1 <= the embedding width

The loss is the library's `gradcache.losses.Matryoshka` around the mode's own loss; `Mode.matryoshka` says where
it goes (text mode wraps the InfoNCE inside its grouping of passages, so that a queue keeps full-width rows). The
held-out metrics at each prefix are gradcache/train/eval/dimensions.py's.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from itertools import pairwise

from torch import nn

from gradcache.losses import Matryoshka
from gradcache.train.errors import UsageError

OPTION = "--matryoshka-dims"


def parse_dims(text: str) -> list[int]:
    """`--matryoshka-dims`: comma-separated ints, e.g. `384,256,128,64` (their values are checked by `check_dims`)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints; give the embedding "
                                         "widths to train, largest first, e.g. 384,256,128,64") from None


def check_dims(dims: Sequence[int], width: int) -> None:
    """Refuse dims that are not strictly decreasing ints in [1, width] (UsageError naming the option)."""
    given = ",".join(map(str, dims))
    if not dims:
        raise UsageError(f"{OPTION} is empty; give the embedding widths to train, e.g. {OPTION} {width},{width // 2}")
    if min(dims) < 1:
        raise UsageError(f"{OPTION} {given}: every width must be at least 1 (a number of columns)")
    if any(later >= earlier for earlier, later in pairwise(dims)):
        fixed = ",".join(map(str, sorted(set(dims), reverse=True)))
        raise UsageError(f"{OPTION} {given}: the widths must be strictly decreasing; give {OPTION} {fixed}")
    if dims[0] > width:
        raise UsageError(f"{OPTION} {given}: {dims[0]} is larger than the model's embedding width {width}; give "
                         f"widths of at most {width}, e.g. {OPTION} {width},{width // 2}")


def unwrapped(loss: nn.Module) -> nn.Module:
    """The mode's own loss inside a `Matryoshka` (its temperature, its logit scale), or `loss` itself."""
    return loss.loss if isinstance(loss, Matryoshka) else loss
