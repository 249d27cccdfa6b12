"""gradcache: large-batch contrastive learning under limited memory.

GradCache and CachedLoss give the full-batch gradient of a contrastive loss at the memory of one chunk;
FullBatch and NaiveAccumulation are the reference and the baseline, with the same signature. An encoder returns
(B, D) vectors, or TokenEmbeddings (token vectors and their mask) for late interaction, or, as a
PairScorer over TextPairs, a cross-encoder's scores (B,).
"""
from gradcache import losses
from gradcache.baselines import FullBatch, NaiveAccumulation
from gradcache.cache import GradCache
from gradcache.cached_loss import CachedLoss
from gradcache.chunks import Chunks
from gradcache.negatives import negatives_per_anchor
from gradcache.pair_scorer import PairScorer
from gradcache.non_finite import (
    NonFiniteEmbeddingError, NonFiniteError, NonFiniteLossError, NonFiniteRecomputationError,
)
from gradcache.recompute_check import RecomputationMismatchError
from gradcache.text_pairs import TextPairs, split_pairs
from gradcache.token_embeddings import TokenEmbeddings

__all__ = ["GradCache", "CachedLoss", "Chunks", "FullBatch", "NaiveAccumulation", "NonFiniteError", "NonFiniteLossError",
           "NonFiniteEmbeddingError", "NonFiniteRecomputationError", "RecomputationMismatchError", "losses",
           "negatives_per_anchor", "TokenEmbeddings", "PairScorer", "TextPairs", "split_pairs"]
__version__ = "0.1.0"
