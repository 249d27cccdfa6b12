"""sentence-transformers' uncached losses computed on given embeddings: the references for InfoNCE's ST options.

``MultipleNegativesRankingLoss`` has ``compute_loss_from_embeddings``; ``GISTEmbedLoss`` embeds inside its
``forward``, so it runs here on stub models whose forward returns fixed embeddings (one per input column), and
is built without its tokenizer checks (which only decide whether to re-tokenize for the guide, never the loss).
ST stacks hard negatives column by column (negative k of every query, then k + 1); gradcache groups them by
query, so ``st_columns`` hands ST views of the same tensor in ST's order and gradients reach the same leaf.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss, MultipleNegativesRankingLoss
from sentence_transformers.util import dot_score


def st_columns(query, positive, negatives):
    """[query, positive, negative_1, ..., negative_h], each (N, D), views of gradcache's grouped layout."""
    n = query.shape[0]
    if negatives is None:
        return [query, positive]
    h = negatives.shape[0] // n
    grouped = negatives.view(n, h, -1)  # (N, h, D): row i holds query i's negatives
    return [query, positive, *(grouped[:, k] for k in range(h))]


def mnrl(query, positive, negatives, temperature: float, similarity: str = "cosine", **options) -> torch.Tensor:
    """MultipleNegativesRankingLoss(scale=1/temperature, similarity_fct=..., **options) on these embeddings."""
    if similarity == "dot":
        options["similarity_fct"] = dot_score
    loss = MultipleNegativesRankingLoss(nn.Identity(), scale=1.0 / temperature, **options)
    return loss.compute_loss_from_embeddings(st_columns(query, positive, negatives), None)


class _Columns(nn.Module):
    """A stub model: features {"column": k} -> {"sentence_embedding": columns[k]}."""

    def __init__(self, columns) -> None:
        super().__init__()
        self.columns = columns

    def forward(self, features):
        return {"sentence_embedding": self.columns[features["column"]]}


def gist(query, positive, negatives, guide, temperature: float, margin_strategy: str, margin: float,
         contrast_anchors: bool, contrast_positives: bool) -> torch.Tensor:
    """GISTEmbedLoss.forward on these embeddings and the guide's (one hard negative per query at most)."""
    columns = st_columns(query, positive, negatives)
    guide_columns = st_columns(*guide) if len(guide) == 3 else st_columns(*guide, None)
    loss = GISTEmbedLoss.__new__(GISTEmbedLoss)
    nn.Module.__init__(loss)
    # GISTEmbedLoss.__init__'s attributes, minus the tokenizer comparison (the stubs need no re-tokenizing).
    loss.model, loss.guide = _Columns(columns), _Columns(guide_columns)
    loss.temperature, loss.similarity_fct = temperature, nn.CosineSimilarity(dim=-1)
    loss.must_retokenize = False
    loss.margin_strategy, loss.margin = margin_strategy, margin
    loss.contrast_anchors, loss.contrast_positives = contrast_anchors, contrast_positives
    loss.gather_across_devices = False
    loss.cross_entropy_loss = nn.CrossEntropyLoss()
    return loss([{"column": k} for k in range(len(columns))], None)
