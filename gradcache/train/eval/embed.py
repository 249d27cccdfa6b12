"""Held-out data as embeddings for evaluation: (N, D) float32 L2-normalised NumPy arrays in the data's order,
encoded in batches under no grad (faiss's inner-product index then ranks by cosine)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gradcache.train.data.images.augment import to_model_input


def embed_images(encode: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, device: torch.device,
                 batch_size: int = 512) -> np.ndarray:
    """(N, D) float32 L2-normalised embeddings of uint8 (N, 3, H, W) images, encoded in batches."""
    return embed_image_outputs(lambda batch: (encode(batch),), images, device, batch_size)[0]


@torch.no_grad()
def embed_image_outputs(encode: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], images: torch.Tensor,
                        device: torch.device, batch_size: int = 512) -> list[np.ndarray]:
    """Each of the k outputs of `encode` (a tuple of (B, D_j) tensors) as (N, D_j) float32 L2-normalised
    embeddings of uint8 (N, 3, H, W) images: several embeddings (features and projection) from one pass."""
    chunks = [[output.float() for output in encode(to_model_input(images[i:i + batch_size].to(device)))]  # bytes cross
              for i in range(0, len(images), batch_size)]  # per batch, k (B, D_j)
    return [F.normalize(torch.cat(outputs), dim=1).cpu().numpy() for outputs in zip(*chunks)]


@torch.no_grad()
def embed_texts(encode: Callable[..., torch.Tensor], tokenizer: Callable, texts: Sequence[str], device: torch.device,
                batch_size: int = 256) -> np.ndarray:
    """(N, D) float32 L2-normalised embeddings of `texts` in their order, encoded in batches of similar length
    (sorted by characters, so a batch pads little)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks = []
    for start in range(0, len(order), batch_size):
        tokens = tokenizer([texts[i] for i in order[start:start + batch_size]])
        chunks.append(encode(**{key: value.to(device) for key, value in tokens.items()}).float())
    embeddings = torch.empty(len(texts), chunks[0].shape[1])
    embeddings[torch.tensor(order)] = F.normalize(torch.cat(chunks), dim=1).cpu()
    return embeddings.numpy()
