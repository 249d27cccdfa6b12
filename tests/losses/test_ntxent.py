import pytest
import torch

from gradcache.losses import NTXent

from . import brute_force


@pytest.mark.parametrize("n, d, temperature", [(1, 3, 0.5), (2, 1, 0.1), (4, 8, 0.5), (6, 16, 0.07), (3, 5, 3.0)])
def test_dense_matches_brute_force_value_and_gradients(n, d, temperature):
    generator = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=generator, dtype=torch.float64, requires_grad=True)
    z2 = (z1.detach() + 0.5 * torch.randn(n, d, generator=generator, dtype=torch.float64)).requires_grad_()
    loss = NTXent(temperature=temperature)(z1, z2)
    grads = torch.autograd.grad(loss, (z1, z2))

    r1, r2 = z1.detach().clone().requires_grad_(), z2.detach().clone().requires_grad_()
    reference = brute_force.ntxent(r1, r2, temperature)
    reference_grads = torch.autograd.grad(reference, (r1, r2))

    torch.testing.assert_close(loss, reference.detach(), rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_swapping_the_views_leaves_the_loss_unchanged():
    generator = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 7, generator=generator), torch.randn(5, 7, generator=generator)
    loss_fn = NTXent(temperature=0.2)
    torch.testing.assert_close(loss_fn(z1, z2), loss_fn(z2, z1))
