"""CLIP's dual encoder as two separate towers, so GradCache can cache each side's gradients on its own."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradcache.models.checkpointing import forward_grad_checkpointing
from gradcache.models.heads import LinearProjection
from gradcache.ranges import is_int


def _feature_size(encoder: nn.Module, name: str) -> int:
    out_dim = getattr(encoder, "out_dim", None)
    if not is_int(out_dim, 1):
        raise TypeError(
            f"{name} ({type(encoder).__name__}) has no positive int attribute out_dim (got {out_dim!r}); "
            f"set {name}.out_dim to the size of the features it returns."
        )
    return out_dim


class EncoderTower(nn.Module):
    """encoder inputs -> projection(encoder(*args, **kwargs)) (B, embed_dim): one side of CLIP."""

    def __init__(self, encoder: nn.Module, projection: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        self.out_dim = getattr(projection, "out_dim", None)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Checkpoint the encoder's blocks."""
        forward_grad_checkpointing(self.encoder, enabled, "encoder", required=True)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.projection(self.encoder(*args, **kwargs))


class CLIP(nn.Module):
    """(images, texts) -> (image embeddings (B, embed_dim), text embeddings (B, embed_dim)), unnormalised.

    Each encoder is followed by a bias-free linear projection into the joint space (Radford et al.
    2021, https://arxiv.org/abs/2103.00020). ``image_tower`` and ``text_tower`` are separate modules
    with disjoint parameters; pass ``[model.image_tower, model.text_tower]`` to GradCache as its two
    encoders. The loss owns the L2 normalisation and the learnable temperature.

    Args:
        image_encoder: images -> (B, image_encoder.out_dim), e.g. ``ViTEncoder`` or ``ResNetEncoder``.
        text_encoder: ``(input_ids=..., attention_mask=...)`` -> (B, text_encoder.out_dim), e.g.
            ``TextEncoder`` or ``HuggingFaceEncoder``.
        embed_dim: size of the joint embedding space.

    Raises:
        TypeError: an encoder without an int ``out_dim`` attribute.
        ValueError: non-positive ``embed_dim``, or the encoders share a parameter.

    Example:
        >>> model = CLIP(ViTEncoder(), TextEncoder(ByteTokenizer.vocab_size), embed_dim=128)
        >>> images, texts = torch.randn(2, 3, 32, 32), ByteTokenizer()(["a cat", "a dog"])
        >>> [e.shape for e in model(images, **texts)]
        [torch.Size([2, 128]), torch.Size([2, 128])]
    """

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, embed_dim: int = 128) -> None:
        super().__init__()
        image_features = _feature_size(image_encoder, "image_encoder")
        text_features = _feature_size(text_encoder, "text_encoder")
        if not is_int(embed_dim, 1):
            raise ValueError(f"embed_dim={embed_dim!r} must be a positive int.")
        shared = {id(p) for p in image_encoder.parameters()} & {id(p) for p in text_encoder.parameters()}
        if shared:
            raise ValueError(
                f"image_encoder and text_encoder share {len(shared)} parameter tensors; CLIP's towers must "
                f"be separate modules, so build two encoders."
            )
        self.image_tower = EncoderTower(image_encoder, LinearProjection(image_features, embed_dim))
        self.text_tower = EncoderTower(text_encoder, LinearProjection(text_features, embed_dim))
        self.embed_dim = embed_dim

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Checkpoint the blocks of both encoders."""
        self.image_tower.set_grad_checkpointing(enabled)
        self.text_tower.set_grad_checkpointing(enabled)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """images -> image embeddings (B, embed_dim)."""
        return self.image_tower(images)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    **kwargs: Any) -> torch.Tensor:
        """token ids (and mask) -> text embeddings (B, embed_dim)."""
        return self.text_tower(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_image(images), self.encode_text(input_ids, attention_mask, **kwargs)
