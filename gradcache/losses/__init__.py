"""Contrastive losses over (N, D) embeddings, each dense or tiled (``tile_size``) with the same value and gradients."""

from .clip import ClipLoss
from .infonce import InfoNCE
from .ntxent import NTXent
from .siglip import SigLipLoss

__all__ = ["InfoNCE", "NTXent", "ClipLoss", "SigLipLoss"]
