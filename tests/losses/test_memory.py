"""Tiled losses never allocate or save an N x N tensor; the dense ones do, so the audit can fail."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .cases import CASE_IDS, CASES

N, D, TILE_SIZE = 300, 16, 64


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor (in elements) that any aten op returns while active, forward or backward."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_flatten(result)[0]:
            if isinstance(value, torch.Tensor) and value.numel() > self.largest:
                self.largest, self.op = value.numel(), func
        return result


def _audit(case, tile_size: int | None) -> tuple[int, int, int]:
    """Largest tensor created in forward, largest saved for backward, largest created in backward."""
    loss_fn = case.make(tile_size)
    inputs = [t.requires_grad_() for t in case.inputs(N, D, dtype=torch.float32)]
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), LargestAllocation() as forward:
        loss = loss_fn(*inputs)
    with LargestAllocation() as backward:
        loss.backward()
    assert all(t.grad is not None for t in inputs)
    return forward.largest, max(saved), backward.largest


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiled_never_holds_an_n_by_n_tensor(case):
    forward, saved, backward = _audit(case, TILE_SIZE)
    assert max(forward, saved, backward) < N * N
    # Strips are (tile, M) with M <= 2N here (hard negatives or NT-Xent's 2N views): O(N * tile), not O(N^2).
    assert max(forward, saved, backward) <= TILE_SIZE * 3 * N


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dense_does_hold_one_so_the_audit_can_fail(case):
    forward, saved, backward = _audit(case, None)
    assert forward >= N * N and saved >= N * N and backward >= N * N
