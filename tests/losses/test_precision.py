"""Half-precision inputs and autocast: the loss computes in float32; low temperatures neither overflow nor NaN."""

import pytest
import torch

from .cases import CASE_IDS, CASES, loss_and_grads


@pytest.mark.parametrize("tile_size", [None, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_half_inputs_accumulate_in_float32(case, dtype, tile_size):
    inputs = case.inputs(9, 8, dtype=dtype)
    loss, grads, _ = loss_and_grads(case.make(tile_size), inputs)
    # The same half values, upcast by hand: the loss must be the float32 computation on them.
    loss32, grads32, _ = loss_and_grads(case.make(tile_size), [t.float() for t in inputs])
    assert loss.dtype == torch.float32
    assert all(grad.dtype == dtype for grad in grads)
    torch.testing.assert_close(loss, loss32, rtol=1e-6, atol=1e-6)
    for grad, grad32 in zip(grads, grads32):
        torch.testing.assert_close(grad, grad32.to(dtype))


@pytest.mark.parametrize("tile_size", [None, 4])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_autocast_does_not_reach_the_loss(case, tile_size):
    """Forward under autocast, backward after it (PyTorch's documented use): float32 results, equal to no autocast."""
    inputs = case.inputs(9, 8, dtype=torch.float32)
    plain, plain_grads, _ = loss_and_grads(case.make(tile_size), inputs)
    loss_fn = case.make(tile_size)
    leaves = [t.clone().requires_grad_() for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    # A bfloat16 matmul would be off by ~1e-2; float32 arithmetic agrees to rounding.
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, plain, rtol=1e-6, atol=1e-6)
    for grad, plain_grad in zip(grads, plain_grads):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, plain_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tiled_backward_inside_autocast_stays_float32(case):
    """The tiled backward is ours, so it also ignores an autocast region that encloses backward itself."""
    inputs = case.inputs(9, 8, dtype=torch.float32)
    plain, plain_grads, _ = loss_and_grads(case.make(4), inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads, _ = loss_and_grads(case.make(4), inputs)
    torch.testing.assert_close(loss, plain, rtol=1e-6, atol=1e-6)
    for grad, plain_grad in zip(grads, plain_grads):
        # The O(N D) ops around the custom function are elementwise, which CPU autocast leaves in float32.
        torch.testing.assert_close(grad, plain_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tile_size", [None, 3])
@pytest.mark.parametrize("temperature", [0.01, 0.001])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_low_temperature_is_finite_and_accurate(case, temperature, tile_size):
    """Scale 100 to 1000 with adversarial pairs (each positive nearly opposite its query): logits gap ~ 2 * scale."""
    inputs = case.inputs(8, 4, dtype=torch.float64, seed=5)
    inputs[1] = -inputs[0] + 0.1 * inputs[1]
    reference, reference_grads, reference_param_grads = loss_and_grads(case.make(None, temperature).double(), inputs)
    loss, grads, param_grads = loss_and_grads(case.make(tile_size, temperature), [t.float() for t in inputs])
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads + param_grads)
    assert loss > 100  # the adversarial pairs really are hard: a clamped or overflowed loss would not get here
    torch.testing.assert_close(loss.double(), reference, rtol=1e-5, atol=0)
    for grad, reference_grad in zip(grads + param_grads, reference_grads + reference_param_grads):
        torch.testing.assert_close(grad.double(), reference_grad, rtol=1e-4, atol=1e-4 * reference_grad.abs().max())
