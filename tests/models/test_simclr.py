import pytest
import torch
from torch import nn

from gradcache.models import ConvNet, ProjectionHead, SimCLRModel


def _model():
    backbone = ConvNet(width=8, groups=4)
    return SimCLRModel(backbone, ProjectionHead(backbone.out_dim, hidden_dim=16, out_dim=8))


def test_forward_is_head_of_backbone_and_embed_is_backbone():
    model = _model()
    images = torch.randn(3, 3, 16, 16)
    features = model.backbone(images)
    torch.testing.assert_close(model.embed(images), features)
    torch.testing.assert_close(model(images), model.head(features))
    assert model(images).shape == (3, 8) and model.out_dim == 8


def test_mismatched_head_raises_value_error():
    with pytest.raises(ValueError, match="backbone.out_dim=64 but head.in_dim=32"):
        SimCLRModel(ConvNet(width=8, groups=4), ProjectionHead(32))


def test_set_grad_checkpointing_reaches_the_backbone():
    model = _model()
    model.set_grad_checkpointing(True)
    assert model.backbone.grad_checkpointing
    model.set_grad_checkpointing(False)
    assert not model.backbone.grad_checkpointing


def test_backbone_without_checkpointing_support_fails_loudly_only_when_enabling():
    model = SimCLRModel(nn.Flatten(), nn.Linear(12, 2))
    model.set_grad_checkpointing(False)
    with pytest.raises(TypeError, match="backbone \\(Flatten\\) has no set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
