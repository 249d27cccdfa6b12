"""SimCLR's network: a backbone f(.) whose features are the representation, and a projection head g(.)."""

from __future__ import annotations

import torch
from torch import nn

from gradcache.models.checkpointing import forward_grad_checkpointing


class SimCLRModel(nn.Module):
    """images (B, C, H, W) -> z = g(f(images)) (B, out_dim); ``embed`` returns h = f(images).

    The contrastive loss sees z; kNN and linear evaluation use h (Chen et al. 2020,
    https://arxiv.org/abs/2002.05709). Both views of a pair go through this one module, so GradCache
    takes it as a single shared encoder.

    Args:
        backbone: maps images to (B, D) features, e.g. ``ConvNet`` or ``ResNetEncoder``.
        head: maps (B, D) to (B, out_dim), e.g. ``ProjectionHead(backbone.out_dim)``.

    Raises:
        ValueError: ``backbone.out_dim`` differs from ``head.in_dim`` (when both are declared).

    Example:
        >>> backbone = ConvNet()
        >>> model = SimCLRModel(backbone, ProjectionHead(backbone.out_dim))
        >>> model(torch.randn(4, 3, 32, 32)).shape, model.embed(torch.randn(4, 3, 32, 32)).shape
        (torch.Size([4, 128]), torch.Size([4, 256]))
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        features, expected = getattr(backbone, "out_dim", None), getattr(head, "in_dim", None)
        if features is not None and expected is not None and features != expected:
            raise ValueError(
                f"backbone.out_dim={features} but head.in_dim={expected}; build the head with "
                f"in_dim=backbone.out_dim."
            )
        self.backbone = backbone
        self.head = head
        self.out_dim = getattr(head, "out_dim", None)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Checkpoint the backbone's blocks (the head is too shallow to be worth recomputing)."""
        forward_grad_checkpointing(self.backbone, enabled, "backbone", required=True)
        forward_grad_checkpointing(self.head, enabled, "head", required=False)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images -> backbone features h (B, backbone.out_dim), the representation to evaluate."""
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))
