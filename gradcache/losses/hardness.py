"""Hardness weighting of negatives: harder negatives (higher similarity) weigh more in the softmax denominator.

    l_ij = s_ij / t + alpha * stopgrad(s_ij)   for the negatives the mode selects;   l_ij = s_ij / t otherwise

s_ij the unscaled similarity of query i and document j (cosine, or dot), alpha = ``hardness_strength``; the
penalty is a constant (no gradient) and is not divided by the temperature. Modes, as sentence-transformers'
``MultipleNegativesRankingLoss(hardness_mode=...)``:

    "in_batch_negatives"  every document of another query (its positive and hard negatives), Lan et al. 2025 Eq. 5
                          (https://arxiv.org/abs/2503.04812, alpha = 9 there)
    "hard_negatives"      query i's own hard negatives only (EmbeddingGemma, https://arxiv.org/abs/2509.20354)
    "all_negatives"       every document but query i's positive
"""

from __future__ import annotations

import torch

from gradcache.ranges import check_finite

from .directions import owned_documents

__all__ = ["HARDNESS_MODES", "check_hardness", "hardness_penalty"]

HARDNESS_MODES = ("in_batch_negatives", "hard_negatives", "all_negatives")


def check_hardness(hardness_mode: object, hardness_strength: object) -> tuple[str | None, float]:
    """Return ``(hardness_mode, hardness_strength)`` if the mode is None or known and the strength finite >= 0."""
    if hardness_mode is not None and hardness_mode not in HARDNESS_MODES:
        raise ValueError(f"hardness_mode must be None or one of {HARDNESS_MODES}, got {hardness_mode!r}")
    check_finite(hardness_strength, "hardness_strength", at_least=0,
                 meaning="alpha, added as alpha * similarity to the selected negatives' logits")
    if hardness_mode is None and hardness_strength != 0:
        raise ValueError(
            f"hardness_strength={hardness_strength} has no effect without hardness_mode; pick hardness_mode from "
            f"{HARDNESS_MODES} or leave hardness_strength at 0"
        )
    return hardness_mode, float(hardness_strength)


def hardness_penalty(similarity: torch.Tensor, hardness_mode: str, hardness_strength: float,
                     hard_negatives: int) -> torch.Tensor:
    """alpha * stopgrad(s) on the negatives ``hardness_mode`` selects, 0 elsewhere: (N, N(1+h)) like ``similarity``.

    Args:
        similarity: (N, N(1+h)) unscaled query-to-document similarities, positives first, then the hard negatives
            grouped by query.
    """
    n = similarity.shape[0]
    owned = owned_documents(n, hard_negatives, similarity.device)  # (N, N(1+h))
    if hardness_mode == "in_batch_negatives":
        selected = ~owned
    elif hardness_mode == "hard_negatives":
        selected = owned.clone()
        selected[:, :n] = False
    else:
        selected = ~torch.eye(n, similarity.shape[1], dtype=torch.bool, device=similarity.device)
    return similarity.detach().mul(hardness_strength).masked_fill_(~selected, 0.0)
