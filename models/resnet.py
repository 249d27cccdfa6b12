"""ResNet-18/34/50 image encoder from torchvision (random init), with optional GroupNorm and a CIFAR stem."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet18, resnet34, resnet50

from gradcache.models.checkpointing import run_block
from gradcache.models.normalization import make_norm_layer

_CONSTRUCTORS = {18: resnet18, 34: resnet34, 50: resnet50}
_OUT_DIMS = {18: 512, 34: 512, 50: 2048}
# Every normalised channel count in these ResNets is a multiple of 64 (64 ... 2048).
_CHANNEL_COUNTS = (64, 128, 256, 512, 1024, 2048)


class ResNetEncoder(nn.Module):
    """images (B, 3, H, W) -> globally pooled features (B, out_dim); torchvision's ResNet without ``fc``.

    Args:
        depth: 18, 34 or 50 (``out_dim`` 512, 512, 2048).
        small_stem: replace the 7x7 stride-2 conv and max-pool by one 3x3 stride-1 conv, the usual
            CIFAR stem, so 32x32 inputs are not reduced to 8x8 before the first stage.
        norm: ``"batch"`` (torchvision's default) or ``"group"`` (every BatchNorm becomes GroupNorm,
            which makes per-example features independent of how a batch is chunked).
        groups: GroupNorm groups, used only with ``norm="group"``; must divide 64.

    Raises:
        ValueError: unsupported ``depth``, ``norm`` or ``groups``.

    Example:
        >>> encoder = ResNetEncoder(depth=18, small_stem=True, norm="group")
        >>> encoder(torch.randn(4, 3, 32, 32)).shape
        torch.Size([4, 512])
    """

    def __init__(self, depth: int = 18, small_stem: bool = False, norm: str = "batch", groups: int = 32) -> None:
        super().__init__()
        if depth not in _CONSTRUCTORS:
            raise ValueError(f"depth={depth!r} is not supported; choose one of {sorted(_CONSTRUCTORS)}.")
        norm_layer = make_norm_layer(norm, groups, _CHANNEL_COUNTS)
        # Keeping torchvision's module names (net.layer1.0.conv1 ...) lets its state dicts load into .net.
        self.net = _CONSTRUCTORS[depth](weights=None, norm_layer=norm_layer)
        self.net.fc = nn.Identity()
        if small_stem:
            self.net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            nn.init.kaiming_normal_(self.net.conv1.weight, mode="fan_out", nonlinearity="relu")
            self.net.maxpool = nn.Identity()
        self.out_dim = _OUT_DIMS[depth]
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each residual block in backward instead of storing its activations."""
        self.grad_checkpointing = enabled

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        net = self.net
        x = net.maxpool(net.relu(net.bn1(net.conv1(images))))
        for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
            for block in stage:
                x = run_block(block, x, checkpointed=self.grad_checkpointing)
        return torch.flatten(net.avgpool(x), 1)  # (B, out_dim)
