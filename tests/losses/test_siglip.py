import pytest
import torch

from gradcache.losses import SigLipLoss

from . import brute_force


@pytest.mark.parametrize(
    "n, d, temperature, bias", [(1, 4, 0.1, -10.0), (2, 1, 0.5, 0.0), (5, 8, 0.1, -10.0), (4, 16, 0.01, -3.0)]
)
def test_dense_matches_brute_force_value_and_gradients(n, d, temperature, bias):
    generator = torch.Generator().manual_seed(n * 100 + d)
    a = torch.randn(n, d, generator=generator, dtype=torch.float64, requires_grad=True)
    b = (a.detach() + 0.8 * torch.randn(n, d, generator=generator, dtype=torch.float64)).requires_grad_()
    loss_fn = SigLipLoss(temperature=temperature, bias=bias).double()
    loss = loss_fn(a, b)
    grads = torch.autograd.grad(loss, (a, b, loss_fn.logit_scale, loss_fn.bias))

    ra, rb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    # The module stores log(1/t) as a float32 parameter; the reference starts from that same value.
    logit_scale = loss_fn.logit_scale.detach().clone().requires_grad_()
    reference_bias = loss_fn.bias.detach().clone().requires_grad_()
    reference = brute_force.siglip(ra, rb, logit_scale, reference_bias)
    reference_grads = torch.autograd.grad(reference, (ra, rb, logit_scale, reference_bias))

    torch.testing.assert_close(loss, reference.detach(), rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_parameters_and_buffers():
    learned, fixed = SigLipLoss(), SigLipLoss(learnable=False)
    assert learned.temperature == pytest.approx(0.1)
    assert learned.bias.item() == -10.0
    assert sorted(name for name, _ in learned.named_parameters()) == ["bias", "logit_scale"]
    assert list(fixed.parameters()) == [] and set(dict(fixed.named_buffers())) == {"bias", "logit_scale"}
    with pytest.raises(ValueError, match="bias"):
        SigLipLoss(bias=float("nan"))
