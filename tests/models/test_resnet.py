import pytest
import torch
import torchvision
from torch import nn

from gradcache.models import ResNetEncoder


@pytest.mark.parametrize("depth,out_dim,device", [(18, 512, "cpu"), (34, 512, "meta"), (50, 2048, "meta")])
def test_shapes_and_out_dim(depth, out_dim, device):
    # The meta device runs the same code on shapes only: the deep models are checked without their cost.
    with torch.device(device):
        encoder = ResNetEncoder(depth=depth, small_stem=True, norm="group")
        images = torch.randn(2, 3, 4, 4)
    assert encoder.out_dim == out_dim
    with torch.no_grad():
        assert encoder(images).shape == (2, out_dim)


def test_forward_matches_torchvision_forward():
    # Our forward opens torchvision's up for checkpointing; it must compute the same function.
    encoder = ResNetEncoder(depth=18).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(encoder(images), encoder.net(images))


def test_torchvision_state_dict_loads_into_net():
    reference = torchvision.models.resnet18(weights=None).state_dict()
    reference = {name: value for name, value in reference.items() if not name.startswith("fc.")}
    ResNetEncoder(depth=18).net.load_state_dict(reference, strict=True)


@pytest.mark.parametrize("depth", [50])  # Bottleneck blocks: conv1-3 norms plus the downsample norm
def test_group_norm_replaces_every_batchnorm(depth):
    with torch.device("meta"):  # structure only: skip the cost of initialising 25 M parameters twice
        batch = ResNetEncoder(depth=depth, norm="batch")
        group = ResNetEncoder(depth=depth, norm="group", groups=16)
    batch_norms = [m for m in batch.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    group_norms = [m for m in group.modules() if isinstance(m, nn.GroupNorm)]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in group.modules())
    assert not any(isinstance(m, nn.GroupNorm) for m in batch.modules())
    assert len(group_norms) == len(batch_norms) > 0
    # Same places: every BatchNorm's module path now holds a GroupNorm of the same width.
    group_by_name = dict(group.named_modules())
    for name, norm in batch.named_modules():
        if isinstance(norm, nn.BatchNorm2d):
            assert isinstance(group_by_name[name], nn.GroupNorm)
            assert group_by_name[name].num_channels == norm.num_features
    assert all(norm.num_groups == 16 for norm in group_norms)
    assert not any(name.endswith("running_mean") for name, _ in group.named_buffers())


def test_small_stem_keeps_resolution_for_small_images():
    small, standard = ResNetEncoder(small_stem=True), ResNetEncoder(small_stem=False)
    assert small.net.conv1.kernel_size == (3, 3) and small.net.conv1.stride == (1, 1)
    assert isinstance(small.net.maxpool, nn.Identity)
    assert standard.net.conv1.kernel_size == (7, 7)
    sizes = {}
    for name, encoder in (("small", small), ("standard", standard)):
        last_block = encoder.net.layer4[-1]
        last_block.register_forward_hook(lambda _m, _i, out, name=name: sizes.__setitem__(name, out.shape[-1]))
        with torch.no_grad():
            encoder.eval()(torch.randn(1, 3, 16, 16))
    assert sizes == {"small": 2, "standard": 1}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"depth": 101}, "depth=101"),
        ({"norm": "layer"}, "norm='layer'"),
        ({"norm": "group", "groups": 48}, "groups=48"),
        ({"norm": "group", "groups": 0}, "groups=0"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNetEncoder(**kwargs)
