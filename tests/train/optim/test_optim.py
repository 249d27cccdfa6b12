
import pytest
import torch
from torch import nn

from gradcache.train.optim.optimizers import (
    LAMB,
    LARS,
    build_optimizer,
    parameter_groups,
    scaled_learning_rate,
)


def _layer():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    for p in layer.parameters():
        p.grad = torch.randn_like(p)
    return layer


def test_lars_step_against_the_formula():
    layer = _layer()
    w, gw = layer.weight.detach().clone(), layer.weight.grad.clone()
    b, gb = layer.bias.detach().clone(), layer.bias.grad.clone()
    lr, wd, eta = 0.5, 0.01, 0.02
    optimizer = LARS(parameter_groups([layer], wd), lr=lr, momentum=0.9, trust_coefficient=eta)
    optimizer.step()
    update = gw + wd * w
    trust = eta * w.norm() / update.norm()
    torch.testing.assert_close(layer.weight.detach(), w - lr * trust * update)
    torch.testing.assert_close(layer.bias.detach(), b - lr * gb)  # biases: no decay, no adaptation
    # second step: the momentum buffer carries the first update
    layer.weight.grad = gw.clone()
    w1 = layer.weight.detach().clone()
    optimizer.step()
    update1 = gw + wd * w1
    buffer = 0.9 * trust * update + eta * w1.norm() / update1.norm() * update1
    torch.testing.assert_close(layer.weight.detach(), w1 - lr * buffer)


def test_lamb_two_steps_against_the_formula():
    layer = _layer()
    w, g = layer.weight.detach().clone(), layer.weight.grad.clone()
    lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-6
    optimizer = LAMB(parameter_groups([layer], wd), lr=lr, betas=(b1, b2), eps=eps)
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t in (1, 2):
        layer.weight.grad = g.clone()
        optimizer.step()
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps) + wd * w
        w = w - lr * w.norm() / r.norm() * r
        torch.testing.assert_close(layer.weight.detach(), w)


def test_trust_ratio_is_one_for_zero_weights():
    weight = nn.Parameter(torch.zeros(2, 2))
    weight.grad = torch.ones(2, 2)
    LARS([{"params": [weight], "weight_decay": 0.0, "adapt": True}], lr=1.0, momentum=0.0).step()
    torch.testing.assert_close(weight.detach(), -torch.ones(2, 2))


def test_groups_split_weights_from_biases_and_norms_and_dedupe_shared():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    decay, plain = parameter_groups([model, model[0]], 0.1)
    assert [p.shape for p in decay["params"]] == [(4, 4)] and decay["weight_decay"] == 0.1
    assert len(plain["params"]) == 3 and plain["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["adamw", "sgd", "lars", "lamb"])
def test_every_optimizer_builds_and_steps(name):
    layer = _layer()
    before = layer.weight.detach().clone()
    build_optimizer(name, [layer], lr=0.1, weight_decay=0.01).step()
    assert not torch.equal(before, layer.weight.detach())


def test_lr_scaling_rules():
    assert scaled_learning_rate(0.1, 1024, 256, "linear") == pytest.approx(0.4)
    assert scaled_learning_rate(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert scaled_learning_rate(0.1, 1024, 256, "none") == 0.1
    with pytest.raises(ValueError, match="--lr-scaling 'cubic'"):
        scaled_learning_rate(0.1, 1024, 256, "cubic")
    with pytest.raises(ValueError, match="--optimizer 'adam'"):
        build_optimizer("adam", [nn.Linear(1, 1)], 0.1, 0.0)
