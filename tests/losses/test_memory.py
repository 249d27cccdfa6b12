"""What the tiled losses allocate: tiles and (N,) statistics, never an N x tile strip, and no (N, D) tensor but the
inputs' gradients; strips and the dense loss do allocate their N x tile and N x N tensors, so the audit can fail."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradcache.losses import checks

from .cases import CASE_IDS, CASES

# N is five tiles; D small, so that every (N, D) input stays below N x TILE_SIZE and a strip would stand out
# (and above a tile, TILE_SIZE^2, so that a tile is not taken for an (N, D) tensor).
N, D, TILE_SIZE = 160, 8, 32
STRIPS = 10 * N  # columns per tile: more than any loss's column count here, i.e. strips of TILE_SIZE rows


class Allocations(TorchDispatchMode):
    """Records the number of elements of every new tensor an aten op returns while active, forward or backward.

    New: its storage is none of the op's arguments' storages, so views (slices, diagonals, transposes, detach)
    and in-place results, which hold no memory of their own, are left out.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        arguments = tree_flatten((args, kwargs))[0]
        storages = {value.untyped_storage().data_ptr() for value in arguments if isinstance(value, torch.Tensor)}
        result = func(*args, **(kwargs or {}))
        self.sizes += [value.numel() for value in tree_flatten(result)[0]
                       if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in storages]
        return result


def _audit(case, tile_size: int | None, column_tile_size: int | None = None):
    """(sizes created in forward, sizes saved for backward, sizes created in backward, the inputs' sizes)."""
    loss_fn = case.make(tile_size, column_tile_size=column_tile_size)
    inputs = [t.requires_grad_() for t in case.inputs(N, D, dtype=torch.float32)]
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), Allocations() as forward:
        loss = loss_fn(*inputs)
    with Allocations() as backward:
        loss.backward()
    assert all(t.grad is not None for t in inputs)
    return forward.sizes, saved, backward.sizes, [t.numel() for t in inputs]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiles_never_hold_a_strip_or_a_copy_of_the_inputs(case, monkeypatch):
    # The NaN/inf check walks blocks of CHECK_ROWS (4096) rows; at this small N, make its blocks tiles too.
    monkeypatch.setattr(checks, "CHECK_ROWS", TILE_SIZE)
    forward, saved, backward, input_sizes = _audit(case, TILE_SIZE)
    largest_input = max(input_sizes)
    assert largest_input < N * TILE_SIZE  # so the bound below says something
    # Nothing of N x tile_size elements or more: tiles (tile^2), (tile, D) rows, (N,) statistics, the inputs.
    assert max(forward + saved + backward) < N * TILE_SIZE
    assert max(forward + saved + backward) <= max(TILE_SIZE**2, largest_input)
    # No (N, D) tensor is made beside the inputs in forward (the unit rows are formed a tile at a time); saved
    # are the inputs themselves; backward makes one (N, D) tensor per input, its gradient, and nothing else.
    assert [size for size in forward if size >= min(input_sizes)] == []
    assert sorted(size for size in saved if size >= min(input_sizes)) == sorted(input_sizes)
    assert sorted(size for size in backward if size >= min(input_sizes)) == sorted(input_sizes)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_strips_do_hold_n_by_tile_so_the_audit_can_fail(case):
    forward, saved, backward, _ = _audit(case, TILE_SIZE, STRIPS)
    assert max(forward) >= N * TILE_SIZE and max(backward) >= N * TILE_SIZE
    assert max(forward + saved + backward) < N * N


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dense_does_hold_n_by_n_so_the_audit_can_fail(case):
    forward, saved, backward, _ = _audit(case, None)
    assert max(forward) >= N * N and max(saved) >= N * N and max(backward) >= N * N
