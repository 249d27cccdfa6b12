"""GradCache as sentence-transformers losses, for `SentenceTransformerTrainer` and `model.fit`:

- `GradCacheLoss(model, loss, chunk_size)`: the counterpart of `CachedMultipleNegativesRankingLoss` (with
  `InfoNCE`), or of any in-batch loss of this library; composes with `MatryoshkaLoss`.
- `GradCacheGISTLoss(model, guide, ...)`: the counterpart of `CachedGISTEmbedLoss`.
- `GradCacheCrossEncoderLoss(model, ...)`: the counterpart of the cross-encoder `CachedMultipleNegativesRankingLoss`.
- `GradCacheMultiVectorLoss(model, ...)`: the counterpart of `CachedMultiVectorMultipleNegativesRankingLoss`
  (ColBERT-style MultiVectorEncoder models), with the tiled MaxSim of `LateInteraction`.
- `GradCacheSpladeLoss(model, loss, document_regularizer_weight, query_regularizer_weight)`: the counterpart of
  `CachedSpladeLoss` (SparseEncoder models), its cache paid by the rows' non-zeros.

Needs `pip install "gradcache[sentence-transformers]"`.
"""
from __future__ import annotations

from gradcache.integrations.optional import require

require("sentence_transformers", "sentence-transformers", "gradcache.integrations.sentence_transformers")

from gradcache.integrations.sentence_transformers.cross_encoder import GradCacheCrossEncoderLoss  # noqa: E402
from gradcache.integrations.sentence_transformers.encoders import sentence_embedding  # noqa: E402
from gradcache.integrations.sentence_transformers.gist import GradCacheGISTLoss  # noqa: E402
from gradcache.integrations.sentence_transformers.loss import GradCacheLoss  # noqa: E402
from gradcache.integrations.sentence_transformers.multi_vector import GradCacheMultiVectorLoss  # noqa: E402
from gradcache.integrations.sentence_transformers.splade import GradCacheSpladeLoss  # noqa: E402

__all__ = ["GradCacheLoss", "GradCacheGISTLoss", "GradCacheMultiVectorLoss", "GradCacheCrossEncoderLoss",
           "GradCacheSpladeLoss", "sentence_embedding"]
