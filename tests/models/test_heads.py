import pytest
import torch
from torch import nn

from gradcache.models import LinearProjection, ProjectionHead


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("norm", ["none", "batch", "layer"])
def test_projection_head_structure_and_shape(layers, norm):
    head = ProjectionHead(16, hidden_dim=8, out_dim=4, layers=layers, norm=norm)
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == layers
    assert (linears[0].in_features, linears[-1].out_features) == (16, 4)
    assert sum(isinstance(m, nn.ReLU) for m in head.modules()) == layers - 1
    norm_type = {"none": None, "batch": nn.BatchNorm1d, "layer": nn.LayerNorm}[norm]
    expected_norms = 0 if norm_type is None else layers - 1
    assert sum(isinstance(m, (nn.BatchNorm1d, nn.LayerNorm)) for m in head.modules()) == expected_norms
    assert head(torch.randn(3, 16)).shape == (3, 4)
    assert head.out_dim == 4


def test_default_head_is_batchnorm_free_two_layer_mlp():
    head = ProjectionHead(16)
    features = torch.randn(5, 16)
    first, second = head.net[0], head.net[2]
    expected = second(torch.relu(first(features)))
    torch.testing.assert_close(head(features), expected)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in head.modules())


def test_linear_projection_is_bias_free_matrix_product():
    projection = LinearProjection(6, 3)
    features = torch.randn(4, 6)
    assert projection.linear.bias is None
    torch.testing.assert_close(projection(features), features @ projection.linear.weight.T)
    assert projection.out_dim == 3


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: ProjectionHead(16, norm="group"), "norm='group'"),
        (lambda: ProjectionHead(16, layers=0), "layers=0"),
        (lambda: ProjectionHead(0), "in_dim=0"),
        (lambda: LinearProjection(4, -1), "out_dim=-1"),
    ],
)
def test_bad_arguments_raise_value_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()
