import pytest
import torch
import torch.nn.functional as F

from gradcache.losses.tiled_sigmoid import tiled_sigmoid_pair_loss


def _inputs(n: int, d: int, seed: int):
    """Raw (unnormalised) rows: the function normalises them itself."""
    generator = torch.Generator().manual_seed(seed)
    a = (3.0 * torch.randn(n, d, generator=generator, dtype=torch.float64)).requires_grad_()
    b = (0.5 * torch.randn(n, d, generator=generator, dtype=torch.float64)).requires_grad_()
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)
    return a, b, scale, bias


@pytest.mark.parametrize(
    "n, tile_size, column_tile_size", [(1, 1, None), (5, 2, None), (6, 3, None), (4, 10, None), (7, 2, 3),
                                       (7, 3, 2), (5, 1, 5), (5, 2, 1)]
)
def test_sum_equals_the_dense_formula(n, tile_size, column_tile_size):
    a, b, scale, bias = _inputs(n, 3, seed=n)
    labels = 2 * torch.eye(n, dtype=torch.float64) - 1  # (N, N)
    logits = scale * F.normalize(a, dim=1) @ F.normalize(b, dim=1).T + bias  # (N, N)
    expected = -F.logsigmoid(labels * logits).sum()
    total = tiled_sigmoid_pair_loss(a, b, scale, bias, tile_size, column_tile_size)
    torch.testing.assert_close(total, expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("tile_size, column_tile_size", [(2, None), (2, 3), (5, 1)])
def test_gradcheck_every_input(tile_size, column_tile_size):
    a, b, scale, bias = _inputs(5, 3, seed=0)
    assert torch.autograd.gradcheck(
        lambda *xs: tiled_sigmoid_pair_loss(*xs, tile_size, column_tile_size), (a, b, scale, bias)
    )


def test_gradcheck_one_tensor_on_both_sides():
    """a is b: one gradient buffer takes the row and the column parts."""
    a, _, scale, bias = _inputs(4, 3, seed=1)
    assert torch.autograd.gradcheck(lambda x, s, c: tiled_sigmoid_pair_loss(x, x, s, c, 3, 2), (a, scale, bias))
