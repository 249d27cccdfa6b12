"""Tiled losses equal the dense ones: values and gradients of the embeddings and of the loss parameters."""

import copy

import pytest
import torch

from .cases import CASE_IDS, CASES, loss_and_grads

# (N, tile_size, column_tile_size), None = square tiles. N a multiple of the tiles, not a multiple, smaller than
# a tile, tiles of 1 (NT-Xent's self pair then fills a whole tile), taller and wider tiles than square, the
# strip scheme (columns per tile >= every column count here), N = 1.
SHAPES = [(12, 4, None), (13, 5, None), (13, 5, 3), (13, 3, 5), (7, 64, None), (7, 2, 64), (5, 1, 1), (6, 4, 1),
          (1, 3, None), (1, 1, 2)]


@pytest.mark.parametrize("n, tile_size, column_tile_size", SHAPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiled_equals_dense_in_float64(case, n, tile_size, column_tile_size):
    dense = case.make(None).double()
    tiled = case.make(tile_size, column_tile_size=column_tile_size).double()
    tiled.load_state_dict(dense.state_dict())
    inputs = case.inputs(n, 6, seed=n)
    dense_loss, dense_grads, dense_param_grads = loss_and_grads(dense, inputs)
    tiled_loss, tiled_grads, tiled_param_grads = loss_and_grads(tiled, inputs)

    assert tiled_loss.dtype == torch.float64
    torch.testing.assert_close(tiled_loss, dense_loss, rtol=1e-12, atol=1e-14)
    assert len(tiled_param_grads) == len(dense_param_grads) == len(list(dense.parameters()))
    for tiled_grad, dense_grad in zip(tiled_grads + tiled_param_grads, dense_grads + dense_param_grads):
        torch.testing.assert_close(tiled_grad, dense_grad, rtol=1e-12, atol=1e-14)


def _error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference, relative to the reference's largest magnitude."""
    return float((value.double() - reference).abs().max() / reference.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("temperature", [None, 0.01])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiled_float32_is_as_accurate_as_dense_float32(case, temperature):
    """Against a float64 reference, tiled float32 errs no more than dense float32 (within a small factor).

    Each error is the worst over four input draws, so one lucky dense rounding does not decide the bound.
    """
    n, d, tile_size, column_tile_size = 41, 16, 16, 7  # 3 x 6 tiles (more for wider candidates), ragged edges
    dense_fn = case.make(None, temperature)
    tiled_fn = case.make(tile_size, temperature, column_tile_size=column_tile_size)
    tiled_fn.load_state_dict(dense_fn.state_dict())
    reference_fn = copy.deepcopy(dense_fn).double()
    flatten = lambda result: [result[0]] + result[1] + result[2]  # noqa: E731
    dense_errors, tiled_errors = None, None
    for seed in range(4):
        inputs = case.inputs(n, d, dtype=torch.float64, seed=seed)
        reference = flatten(loss_and_grads(reference_fn, inputs))
        dense = flatten(loss_and_grads(dense_fn, [t.float() for t in inputs]))
        tiled = flatten(loss_and_grads(tiled_fn, [t.float() for t in inputs]))
        assert all(t.dtype == torch.float32 for t in dense + tiled)
        dense_seed = [_error(value, ref) for value, ref in zip(dense, reference)]
        tiled_seed = [_error(value, ref) for value, ref in zip(tiled, reference)]
        dense_errors = dense_seed if dense_errors is None else list(map(max, dense_errors, dense_seed))
        tiled_errors = tiled_seed if tiled_errors is None else list(map(max, tiled_errors, tiled_seed))

    # A few float32 ulps of floor keep the bound meaningful where dense happens to be nearly exact.
    floor = 8 * torch.finfo(torch.float32).eps
    for dense_error, tiled_error in zip(dense_errors, tiled_errors):
        assert tiled_error <= 4 * dense_error + floor


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tile_size_is_only_a_memory_knob(case):
    """Several tile shapes, one answer; and the module copies its tile sizes, not its state."""
    inputs = case.inputs(10, 4, seed=3)
    shapes = [(1, None), (3, None), (10, None), (11, None), (3, 7), (7, 3), (4, 100)]
    losses = [loss_and_grads(case.make(rows, column_tile_size=columns).double(), inputs)[0] for rows, columns in shapes]
    for loss in losses[1:]:
        torch.testing.assert_close(loss, losses[0], rtol=1e-12, atol=1e-14)
    copied = copy.deepcopy(case.make(3, column_tile_size=5))
    assert (copied.tile_size, copied.column_tile_size) == (3, 5)
