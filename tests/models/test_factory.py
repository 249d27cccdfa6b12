import dataclasses

import pytest
import torch

from gradcache.models import IMAGE_ENCODER_PRESETS, ConvNet, ResNetEncoder, ViTEncoder, build_image_encoder


@pytest.mark.parametrize(
    "name,kind,out_dim",
    [
        ("convnet", ConvNet, 256),
        ("resnet18", ResNetEncoder, 512),
        ("resnet34", ResNetEncoder, 512),
        ("resnet50", ResNetEncoder, 2048),
        ("vit_tiny", ViTEncoder, 192),
    ],
)
def test_every_name_builds_its_encoder(name, kind, out_dim):
    with torch.device("meta"):  # which class and size, not the cost of initialising it
        encoder = build_image_encoder(name)
    assert type(encoder) is kind and encoder.out_dim == out_dim
    assert callable(encoder.set_grad_checkpointing)


def test_presets_are_dataclasses_and_names_are_exactly_the_documented_ones():
    assert set(IMAGE_ENCODER_PRESETS) == {"convnet", "resnet18", "resnet34", "resnet50", "vit_tiny"}
    assert all(dataclasses.is_dataclass(config) for config in IMAGE_ENCODER_PRESETS.values())


def test_keyword_arguments_override_the_preset_without_changing_it():
    encoder = build_image_encoder("convnet", width=8, in_channels=1, groups=4)
    assert encoder.out_dim == 64
    assert encoder(torch.randn(2, 1, 16, 16)).shape == (2, 64)
    assert IMAGE_ENCODER_PRESETS["convnet"].width == 32
    vit = build_image_encoder("vit_tiny", image_size=16, layers=1)
    assert vit(torch.randn(1, 3, 16, 16)).shape == (1, 192)
    resnet = build_image_encoder("resnet18", small_stem=True, norm="group")
    assert resnet.net.conv1.kernel_size == (3, 3)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="'resnet101'.*convnet.*resnet18.*vit_tiny"):
        build_image_encoder("resnet101")


def test_unknown_option_names_the_valid_options():
    with pytest.raises(TypeError, match="does not take \\['image_size'\\].*small_stem"):
        build_image_encoder("resnet18", image_size=32)


def test_bad_option_value_is_checked_by_the_encoder():
    with pytest.raises(ValueError, match="norm='layer'"):
        build_image_encoder("convnet", norm="layer")
