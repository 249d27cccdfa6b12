import pytest
import torch
import torch.nn.functional as F

from gradcache.losses.tiled_sigmoid import tiled_sigmoid_pair_loss


def _inputs(n: int, d: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=1).requires_grad_()
    b = F.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=1).requires_grad_()
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)
    return a, b, scale, bias


@pytest.mark.parametrize("n, tile_size", [(1, 1), (5, 2), (6, 3), (4, 10)])
def test_sum_equals_the_dense_formula(n, tile_size):
    a, b, scale, bias = _inputs(n, 3, seed=n)
    labels = 2 * torch.eye(n, dtype=torch.float64) - 1  # (N, N)
    expected = -F.logsigmoid(labels * (scale * a @ b.T + bias)).sum()
    torch.testing.assert_close(tiled_sigmoid_pair_loss(a, b, scale, bias, tile_size), expected, rtol=1e-13, atol=0)


def test_gradcheck_every_input():
    a, b, scale, bias = _inputs(5, 3, seed=0)
    assert torch.autograd.gradcheck(lambda *xs: tiled_sigmoid_pair_loss(*xs, 2), (a, b, scale, bias))
