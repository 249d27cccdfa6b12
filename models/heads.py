"""Projection heads: the SimCLR MLP and CLIP's linear map into the shared embedding space."""

from __future__ import annotations

import torch
from torch import nn

from gradcache.ranges import is_int

HEAD_NORMS = ("none", "batch", "layer")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not is_int(value, 1):
            raise ValueError(f"{name}={value!r} must be a positive int.")


class ProjectionHead(nn.Module):
    """features (B, in_dim) -> projection (B, out_dim) through ``layers`` linear maps with ReLU between.

    The SimCLR head g(.): ``Linear -> [norm] -> ReLU`` repeated ``layers - 1`` times, then a final
    ``Linear``. Without normalisation by default: BatchNorm in the head makes each example's projection
    depend on the rest of its chunk, which GradCache's chunked encoding does not reproduce exactly.

    Args:
        in_dim: backbone feature size.
        hidden_dim: width of the hidden layers.
        out_dim: projection size (the space the contrastive loss sees).
        layers: number of linear maps (1 gives a single linear projection).
        norm: ``"none"``, ``"batch"`` (BatchNorm1d, as in the SimCLR paper) or ``"layer"``.

    Raises:
        ValueError: a non-positive size or an unknown ``norm``.

    Example:
        >>> head = ProjectionHead(512, hidden_dim=512, out_dim=128)
        >>> head(torch.randn(4, 512)).shape
        torch.Size([4, 128])
    """

    def __init__(self, in_dim: int, hidden_dim: int = 512, out_dim: int = 128, layers: int = 2,
                 norm: str = "none") -> None:
        super().__init__()
        _check_positive(in_dim=in_dim, hidden_dim=hidden_dim, out_dim=out_dim, layers=layers)
        if norm not in HEAD_NORMS:
            raise ValueError(f"norm={norm!r} is not supported; choose one of {HEAD_NORMS}.")
        modules: list[nn.Module] = []
        width = in_dim
        for _ in range(layers - 1):
            # A bias before a normalisation layer is cancelled by it.
            modules.append(nn.Linear(width, hidden_dim, bias=norm == "none"))
            if norm == "batch":
                modules.append(nn.BatchNorm1d(hidden_dim))
            elif norm == "layer":
                modules.append(nn.LayerNorm(hidden_dim))
            modules.append(nn.ReLU(inplace=True))
            width = hidden_dim
        modules.append(nn.Linear(width, out_dim))
        self.net = nn.Sequential(*modules)
        self.in_dim = in_dim
        self.out_dim = out_dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


class LinearProjection(nn.Module):
    """features (B, in_dim) -> features @ W (B, out_dim): CLIP's bias-free projection into the joint space.

    Example:
        >>> LinearProjection(512, 128)(torch.randn(4, 512)).shape
        torch.Size([4, 128])
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        _check_positive(in_dim=in_dim, out_dim=out_dim)
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        # CLIP's scale: unit-variance features keep roughly unit-variance projections.
        nn.init.normal_(self.linear.weight, std=in_dim**-0.5)
        self.in_dim = in_dim
        self.out_dim = out_dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)
