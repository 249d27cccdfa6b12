import pytest
import torch

from gradcache.models import ViTEncoder


def _small(**kwargs):
    return ViTEncoder(**{"image_size": 16, "patch_size": 4, "width": 32, "layers": 2, "heads": 2, **kwargs})


def test_default_is_vit_tiny_for_32x32():
    encoder = ViTEncoder()
    assert encoder.out_dim == 192
    assert len(encoder.net.encoder.layers) == 6
    assert encoder(torch.randn(2, 3, 32, 32)).shape == (2, 192)


def test_forward_matches_torchvision_forward():
    # Our forward opens torchvision's encoder loop up for checkpointing; same function, head removed.
    encoder = _small().eval()
    images = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(encoder(images), encoder.net(images))


def test_mlp_ratio_sets_the_block_hidden_size():
    encoder = _small(mlp_ratio=2)
    linear = encoder.net.encoder.layers[0].mlp[0]
    assert (linear.in_features, linear.out_features) == (32, 64)


def test_wrong_image_size_raises_value_error():
    with pytest.raises(ValueError, match="image_size"):
        _small()(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"image_size": 18}, "patch_size=4"),
        ({"width": 30, "heads": 4}, "heads=4"),
        ({"layers": 0}, "layers=0"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _small(**kwargs)
