"""One step of each side of the peer comparisons, built from a JSON point; peers are imported only when used.

Text sides train one `models.TextEncoder` on (query, positive) token batches with in-batch negatives.
CLIP sides run a contrastive loss alone, forward and backward, on random (N, D) image and text features.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradcache import CachedLoss, GradCache, losses
from gradcache.models import TextEncoder

VOCAB_SIZE = 259  # ByteTokenizer's vocabulary
TEXT_SIDES = ("gradcache", "cached_loss", "st_cached_mnrl")
CLIP_SIDES = ("ours_dense", "ours_tiled", "open_clip")
TEMPERATURE = 0.05  # InfoNCE's temperature; sentence-transformers' scale 20 = 1 / 0.05


class SentenceEmbedding(nn.Module):
    """features {input_ids, attention_mask} -> features plus "sentence_embedding": the interface
    sentence-transformers' losses call, around the very encoder our strategies are given."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        embedding = self.encoder(features["input_ids"], features["attention_mask"])  # (B, width)
        return {**features, "sentence_embedding": embedding}


def _text_batch(point: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    size = (point["batch"], point["text_length"])
    return {"input_ids": torch.randint(3, VOCAB_SIZE, size, device=device),
            "attention_mask": torch.ones(size, dtype=torch.long, device=device)}


def _text_step(point: dict[str, Any], device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    encoder = TextEncoder(VOCAB_SIZE, context_length=point["text_length"], width=point["text_width"],
                          layers=point["text_layers"]).to(device)
    query, positive = _text_batch(point, device), _text_batch(point, device)
    side, mini_batch = point["side"], point["mini_batch"]
    if side == "gradcache":
        strategy = GradCache(encoder, losses.InfoNCE(temperature=TEMPERATURE), mini_batch)
        run = lambda: strategy.step(query, positive)  # noqa: E731
    elif side == "cached_loss":
        cached = CachedLoss(encoder, losses.InfoNCE(temperature=TEMPERATURE), mini_batch)
        run = lambda: cached(query, positive).backward()  # noqa: E731
    elif side == "st_cached_mnrl":
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

        model = SentenceTransformer(modules=[SentenceEmbedding(encoder)], device=str(device))
        peer = CachedMultipleNegativesRankingLoss(model, scale=1.0 / TEMPERATURE, mini_batch_size=mini_batch)
        run = lambda: peer([query, positive], None).backward()  # noqa: E731
    else:
        raise ValueError(f"side={side!r} is not a text side; choose one of {TEXT_SIDES}.")

    def step() -> None:
        run()
        encoder.zero_grad(set_to_none=True)
    return step


def _clip_step(point: dict[str, Any], device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    shape = (point["batch"], point["embed_dim"])
    image = torch.randn(shape, device=device, requires_grad=True)
    text = torch.randn(shape, device=device, requires_grad=True)
    side = point["side"]
    if side in ("ours_dense", "ours_tiled"):
        tile_size = point["tile_size"] if side == "ours_tiled" else None
        loss_fn = losses.ClipLoss(temperature=0.07, learnable=False, tile_size=tile_size).to(device)
        run = lambda: loss_fn(image, text).backward()  # noqa: E731
    elif side == "open_clip":
        from open_clip.loss import ClipLoss as OpenClipLoss

        peer, scale = OpenClipLoss(), torch.tensor(1.0 / 0.07, device=device)
        # open_clip expects unit features, ours normalises inside: the normalisation is counted on both sides
        run = lambda: peer(F.normalize(image, dim=-1), F.normalize(text, dim=-1), scale).backward()  # noqa: E731
    else:
        raise ValueError(f"side={side!r} is not a CLIP-loss side; choose one of {CLIP_SIDES}.")

    def step() -> None:
        run()
        image.grad, text.grad = None, None
    return step


def build_step(point: dict[str, Any], device: torch.device) -> Callable[[], None]:
    """The point's side as a zero-argument step (gradients cleared after each)."""
    return _text_step(point, device) if point["side"] in TEXT_SIDES else _clip_step(point, device)
