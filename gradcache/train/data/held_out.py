"""The held-out split of every mode: a seeded permutation whose first `test_size` items are held out, the
same whatever the data's kind (images, rows)."""
from __future__ import annotations

import torch


def held_out_order(count: int, test_size: int, seed: int, items: str) -> torch.Tensor:
    """A permutation of `count` items that depends only on `seed`; its first `test_size` are held out.

    Raises:
        ValueError: unless 0 < test_size < count (the message names `items` and the fix).
    """
    if not 0 < test_size < count:
        raise ValueError(f"the held-out split needs 0 < --test-size < {count} {items}, got {test_size}; "
                         f"pass a smaller --test-size or provide more {items}")
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))
