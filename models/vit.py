"""Vision Transformer image encoder from torchvision (random init): the class token's final state."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

from gradcache.models.checkpointing import run_block
from gradcache.ranges import is_int


class ViTEncoder(nn.Module):
    """images (B, 3, image_size, image_size) -> layer-normed class token (B, out_dim), out_dim = width.

    torchvision's ``VisionTransformer`` with its classification head removed. The defaults are a
    ViT-Tiny-like model for 32x32 images: 4x4 patches give 64 tokens plus the class token.

    Args:
        image_size: side of the square input images; must be divisible by ``patch_size``.
        patch_size: side of the square patches.
        width: token dimension; must be divisible by ``heads``.
        layers: number of encoder blocks.
        heads: attention heads per block.
        mlp_ratio: hidden size of each block's MLP, as a multiple of ``width``.

    Raises:
        ValueError: ``image_size`` not divisible by ``patch_size`` or ``width`` by ``heads``.

    Example:
        >>> encoder = ViTEncoder(image_size=32, patch_size=4)
        >>> encoder(torch.randn(4, 3, 32, 32)).shape
        torch.Size([4, 192])
    """

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        width: int = 192,
        layers: int = 6,
        heads: int = 3,
        mlp_ratio: int = 4,
    ) -> None:
        super().__init__()
        for name, value in (("image_size", image_size), ("patch_size", patch_size), ("width", width),
                            ("layers", layers), ("heads", heads), ("mlp_ratio", mlp_ratio)):
            if not is_int(value, 1):
                raise ValueError(f"{name}={value!r} must be a positive int.")
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} is not divisible by patch_size={patch_size}.")
        if width % heads:
            raise ValueError(f"width={width} is not divisible by heads={heads}.")
        self.net = VisionTransformer(
            image_size=image_size,
            patch_size=patch_size,
            num_layers=layers,
            num_heads=heads,
            hidden_dim=width,
            mlp_dim=width * mlp_ratio,
        )
        self.net.heads = nn.Identity()
        self.image_size = image_size
        self.out_dim = width
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each encoder block in backward instead of storing its activations."""
        self.grad_checkpointing = enabled

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"images of shape {tuple(images.shape)} do not match this encoder; expected "
                f"(B, 3, {self.image_size}, {self.image_size}) (set image_size when building it)."
            )
        # Same steps as VisionTransformer.forward, with the encoder's block loop opened up for checkpointing.
        tokens = self.net._process_input(images)  # (B, num_patches, width)
        class_token = self.net.class_token.expand(tokens.shape[0], -1, -1)  # (B, 1, width)
        x = torch.cat([class_token, tokens], dim=1)  # (B, 1 + num_patches, width)
        encoder = self.net.encoder
        x = encoder.dropout(x + encoder.pos_embedding)
        for block in encoder.layers:
            x = run_block(block, x, checkpointed=self.grad_checkpointing)
        return encoder.ln(x)[:, 0]  # (B, width)
