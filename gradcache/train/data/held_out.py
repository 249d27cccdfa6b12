"""The held-out split of every mode: how many items are held out (`held_out_size`: --test-size, or by default a
tenth of the data, at most `DEFAULT_MOST` of its kind), and which (`held_out_order`: a seeded permutation whose
first items are held out), the same whatever the data's kind (images, rows)."""
from __future__ import annotations

import torch

# By kind of item: the most the default holds out, and what generated data (the built-in shapes and world) and
# streamed data (whose count is not known before reading) hold out. A smaller data set holds out a tenth of its
# items (the built-in digits, 1,797 images, hold out 179).
DEFAULT_MOST = {"images": 2048, "rows": 300}
DEFAULT_SHARE = 10  # the default holds out one item in DEFAULT_SHARE


def held_out_size(test_size: int | None, count: int | None, items: str) -> int:
    """test_size when given (--test-size), else min(DEFAULT_MOST[items], max(1, count // DEFAULT_SHARE)); with
    `count` None (generated or streamed data) DEFAULT_MOST[items]."""
    if test_size is not None:
        return test_size
    most = DEFAULT_MOST[items]
    return most if count is None else min(most, max(1, count // DEFAULT_SHARE))


def default_held_out_help(items: str) -> str:
    """What --test-size's default holds out, for --help."""
    return (f"default: a tenth of --data's {items}, at least 1, at most {DEFAULT_MOST[items]}; generated and "
            f"streamed data: {DEFAULT_MOST[items]}")


def held_out_order(count: int, test_size: int, seed: int, items: str) -> torch.Tensor:
    """A permutation of `count` items that depends only on `seed`; its first `test_size` are held out.

    Raises:
        ValueError: unless 0 < test_size < count (the message names `items` and the fix).
    """
    if not 0 < test_size < count:
        raise ValueError(f"the held-out split needs 0 < --test-size < {count} {items}, got {test_size}; "
                         f"pass a smaller --test-size or provide more {items}")
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))
