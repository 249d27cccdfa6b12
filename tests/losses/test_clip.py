import pytest
import torch

from gradcache.losses import ClipLoss

from . import brute_force


@pytest.mark.parametrize("n, d, temperature", [(1, 4, 0.07), (2, 1, 0.5), (5, 8, 0.07), (4, 16, 0.01), (3, 3, 1.0)])
def test_dense_matches_brute_force_value_and_gradients(n, d, temperature):
    generator = torch.Generator().manual_seed(n * 100 + d)
    image = torch.randn(n, d, generator=generator, dtype=torch.float64, requires_grad=True)
    text = (image.detach() + 0.8 * torch.randn(n, d, generator=generator, dtype=torch.float64)).requires_grad_()
    loss_fn = ClipLoss(temperature=temperature).double()
    loss = loss_fn(image, text)
    grads = torch.autograd.grad(loss, (image, text, loss_fn.logit_scale))

    ri, rt = image.detach().clone().requires_grad_(), text.detach().clone().requires_grad_()
    # The module stores log(1/t) as a float32 parameter; the reference starts from that same value.
    logit_scale = loss_fn.logit_scale.detach().clone().requires_grad_()
    reference = brute_force.clip(ri, rt, logit_scale)
    reference_grads = torch.autograd.grad(reference, (ri, rt, logit_scale))

    torch.testing.assert_close(loss, reference.detach(), rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_temperature_property_and_learnable_switch():
    learned, fixed = ClipLoss(temperature=0.07), ClipLoss(temperature=0.07, learnable=False)
    assert learned.temperature == pytest.approx(0.07)
    assert [name for name, _ in learned.named_parameters()] == ["logit_scale"]
    assert list(fixed.parameters()) == [] and "logit_scale" in dict(fixed.named_buffers())
    torch.testing.assert_close(learned.logit_scale, fixed.logit_scale)


def test_clamp_logit_scale_caps_the_scale_and_keeps_forward_gradient():
    loss_fn = ClipLoss(temperature=0.001)  # scale 1000, above CLIP's cap of 100
    image, text = torch.randn(4, 8), torch.randn(4, 8)
    loss_fn(image, text).backward()
    # Forward does not clamp: the gradient reaches logit_scale even above the cap.
    assert loss_fn.logit_scale.grad is not None and loss_fn.logit_scale.grad != 0
    loss_fn.clamp_logit_scale()
    assert loss_fn.temperature == pytest.approx(0.01)
    loss_fn.clamp_logit_scale(max_scale=1000.0)  # below the cap: unchanged
    assert loss_fn.temperature == pytest.approx(0.01)
    with pytest.raises(ValueError, match="max_scale"):
        loss_fn.clamp_logit_scale(max_scale=0.0)
