"""UnitBlocks reads stacked raw inputs as F.normalize's unit rows, tile by tile, and maps gradients back exactly."""

import pytest
import torch
import torch.nn.functional as F

from gradcache.losses.unit_blocks import UnitBlocks, distinct_inputs, spans, to_input_gradients


def _inputs(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(0)
    first = 3.0 * torch.randn(5, 4, generator=generator, dtype=torch.float64)
    second = 0.2 * torch.randn(4, 4, generator=generator, dtype=torch.float64)
    first[2] = 0.0  # a zero row: F.normalize divides it by eps and passes g / eps back
    second[1] = 1e-14  # shorter than eps as well, but not zero
    return first.to(dtype), second.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_are_f_normalize_bit_for_bit_across_the_seam(dtype):
    first, second = _inputs(dtype)
    # The second tensor used twice: a stack of [first; second; second], (14, D).
    tensors, (parts,) = distinct_inputs([first, second, second])
    assert len(tensors) == 2 and parts == (0, 1, 1)
    units = UnitBlocks(tensors, parts)
    expected = torch.cat([F.normalize(first, dim=1), F.normalize(second, dim=1), F.normalize(second, dim=1)])
    for size in (1, 3, 4, 14, 20):
        blocks = torch.cat([units.block(start, stop) for start, stop in spans(units.count, size)])
        assert torch.equal(blocks, expected)


def test_gradients_added_per_block_map_back_as_through_f_normalize():
    first, second = (t.requires_grad_() for t in _inputs(torch.float64))
    upstream = torch.randn(14, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # (14, D)
    stacked = torch.cat([F.normalize(first, dim=1), F.normalize(second, dim=1), F.normalize(first, dim=1)])
    expected = torch.autograd.grad(stacked, (first, second), upstream)

    tensors, (parts,) = distinct_inputs([first, second, first])
    units = UnitBlocks(tensors, parts)
    grads = [torch.zeros_like(t) for t in tensors]
    for start, stop in spans(units.count, 3):  # blocks straddle both seams
        if start % 2:
            units.add(grads, start, stop, upstream[start:stop])
        else:  # the same value as a product, through the addmm path
            units.add_product(grads, start, stop, upstream[start:stop], torch.eye(4, dtype=torch.float64))
    to_input_gradients(tensors, grads, block_rows=2)
    for grad, reference in zip(grads, expected):
        torch.testing.assert_close(grad, reference, rtol=1e-12, atol=0)
    assert grads[0][2].abs().max() > 1e10  # the zero row really was divided by eps
