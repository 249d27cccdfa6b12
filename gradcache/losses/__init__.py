"""Contrastive losses over (N, D) embeddings (``LateInteraction``: over token embeddings; ``ListwiseRerank``,
``PointwiseRerank``: over a cross-encoder's (M,) scores), each dense or tiled (``tile_size``) with the same value and gradients,
each with an optional queue of past embeddings as extra negatives (``queue_size``, see ``queue.py``); ``Matryoshka``
sums any of them over nested prefixes of the embeddings.

Every option after ``temperature`` is keyword-only (``InfoNCE(0.05, symmetric=True)``), and so is ``Matryoshka``'s
``weights``: a positional call cannot set one option while meaning another."""

from .clip import ClipLoss
from .infonce import InfoNCE
from .late_interaction import LateInteraction
from .listwise_rerank import ListwiseRerank
from .matryoshka import Matryoshka
from .ntxent import NTXent
from .pointwise_rerank import PointwiseRerank
from .queue import EmbeddingQueue
from .siglip import SigLipLoss
from .sparsity import FlopsRegularizer, L1Regularizer
from .splade import SpladeLoss

__all__ = ["InfoNCE", "NTXent", "ClipLoss", "SigLipLoss", "Matryoshka", "EmbeddingQueue", "LateInteraction",
           "ListwiseRerank", "PointwiseRerank", "SpladeLoss", "FlopsRegularizer", "L1Regularizer"]
