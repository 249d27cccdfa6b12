"""Contrastive losses over (N, D) embeddings, each dense or tiled (``tile_size``) with the same value and gradients,
each with an optional queue of past embeddings as extra negatives (``queue_size``, see ``queue.py``)."""

from .clip import ClipLoss
from .infonce import InfoNCE
from .ntxent import NTXent
from .queue import EmbeddingQueue
from .siglip import SigLipLoss

__all__ = ["InfoNCE", "NTXent", "ClipLoss", "SigLipLoss", "EmbeddingQueue"]
