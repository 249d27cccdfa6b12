import pytest
import torch
from torch import nn

from gradcache.models import ConvNet


@pytest.mark.parametrize("width,in_channels,size", [(32, 3, 32), (8, 1, 16), (16, 3, 8)])
def test_shapes_and_out_dim(width, in_channels, size):
    encoder = ConvNet(width=width, in_channels=in_channels)
    assert encoder.out_dim == 8 * width
    assert encoder(torch.randn(3, in_channels, size, size)).shape == (3, 8 * width)


def test_group_norm_default_has_no_batchnorm_and_batch_option_has_no_groupnorm():
    group, batch = ConvNet(), ConvNet(norm="batch")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in group.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in group.modules()) == 4
    assert sum(isinstance(m, nn.BatchNorm2d) for m in batch.modules()) == 4
    assert not any(isinstance(m, nn.GroupNorm) for m in batch.modules())


def test_group_norm_features_do_not_depend_on_the_rest_of_the_batch():
    encoder = ConvNet(width=8, groups=4).train()
    images = torch.randn(5, 3, 16, 16)
    whole = encoder(images)
    chunked = torch.cat([encoder(images[:2]), encoder(images[2:])])
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-5)


def test_forward_is_the_mean_of_the_last_stage():
    encoder = ConvNet(width=8, groups=4)
    images = torch.randn(2, 3, 16, 16)
    x = images
    for stage in encoder.stages:
        x = stage(x)
    assert x.shape[-2:] == (2, 2)  # three 2x2 max-pools
    torch.testing.assert_close(encoder(images), x.mean(dim=(2, 3)))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"norm": "instance"}, "norm='instance'"),
        ({"width": 12, "groups": 8}, "groups=8"),
        ({"width": 0}, "width=0"),
        ({"in_channels": -1}, "in_channels=-1"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvNet(**kwargs)


def test_group_norm_convnet_standardises_its_conv_weights():
    """W' = (W - mean) / std per output channel, against F.conv2d with W' computed here."""
    import torch.nn.functional as F

    from gradcache.models.convnet import StandardizedConv2d

    torch.manual_seed(0)
    net = ConvNet(width=8, norm="group")
    assert all(isinstance(s[0], StandardizedConv2d) for s in net.stages)
    assert not any(isinstance(s[0], StandardizedConv2d) for s in ConvNet(width=8, norm="batch").stages)
    conv = net.stages[0][0]
    w = conv.weight
    standardised = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(conv(x), F.conv2d(x, standardised, padding=1), atol=1e-5)
    assert not torch.allclose(conv(x), F.conv2d(x, w, padding=1), atol=1e-3)
