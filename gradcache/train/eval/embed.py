"""Held-out data as embeddings for evaluation: (N, D) float32 L2-normalised NumPy arrays in the data's order,
encoded in batches under no grad (faiss's inner-product index then ranks by cosine)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gradcache.train.data.images.augment import to_model_input


@torch.no_grad()
def embed_images(encode: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, device: torch.device,
                 batch_size: int = 512) -> np.ndarray:
    """(N, D) float32 L2-normalised embeddings of uint8 (N, 3, H, W) images, encoded in batches."""
    chunks = [encode(to_model_input(images[i:i + batch_size]).to(device)).float()
              for i in range(0, len(images), batch_size)]
    return F.normalize(torch.cat(chunks), dim=1).cpu().numpy()


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
