"""GISTEmbed's loss: InfoNCE whose in-batch negatives are filtered by a guide model's judgement of false negatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_embeddings, check_finite_number, check_same_rows, check_temperature

__all__ = ["GISTLoss", "MARGIN_STRATEGIES"]

MARGIN_STRATEGIES = ("absolute", "relative")


class GISTLoss(nn.Module):
    """Cross-entropy of each anchor against its positive, among the candidates the guide does not call false negatives.

    L = -1/N sum_i log( e^{s(a_i,p_i)/t} / (sum_{j in P_i} e^{s(a_i,p_j)/t} + sum_{j in A_i} e^{s(a_i,a_j)/t}
        + sum_{j in Q_i} e^{s(p_i,p_j)/t} + sum_{k in K_i} e^{s(a_i,n_k)/t}) ),
    where s is the model's cosine similarity, g the guide's, and each set keeps a candidate x of row i only if
    g(., x) <= g(a_i, p_i) - m_i, with m_i = margin ("absolute") or margin * |g(a_i, p_i)| ("relative");
    P_i always keeps p_i; A_i is empty unless contrast_anchors, Q_i unless contrast_positives, K_i without
    negatives.

    Paper: Solatorio 2024, GISTEmbed, https://arxiv.org/abs/2402.16829. Equals sentence-transformers'
    `GISTEmbedLoss` (and `CachedGISTEmbedLoss`) given the same embeddings; the guide's embeddings are constants.

    Args:
        temperature: t > 0; divides the cosine similarity (GISTEmbed's default 0.01).
        margin_strategy: "absolute" or "relative", how the margin m_i is read (see the formula).
        margin: the margin; 0.0 with "absolute" drops candidates the guide finds closer than the positive.
        contrast_anchors: include the anchor-anchor similarities A_i.
        contrast_positives: include the positive-positive similarities Q_i.

    Shapes (``forward``):
        anchor, positive: (N, D), row i of positive the positive of anchor i; negative: optional (M, D), every
        anchor scored against every row. anchor_guide, positive_guide, negative_guide: the guide's (., G)
        embeddings of the same rows; G may differ from D. Returns a 0-dim tensor.

    Raises:
        ValueError: temperature <= 0, a margin_strategy other than "absolute" / "relative", a non-finite
            margin; in forward, rows that differ between an input and its guide embedding, a negative without
            its guide embedding (or the other way round), NaN/inf entries. TypeError: a non-floating input.

    Example:
        >>> loss_fn = GISTLoss(temperature=0.01)
        >>> loss = loss_fn(anchor, positive, anchor_guide=guide_anchor, positive_guide=guide_positive)
    """

    def __init__(
        self, temperature: float = 0.01, margin_strategy: str = "absolute", margin: float = 0.0,
        contrast_anchors: bool = True, contrast_positives: bool = True,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        if margin_strategy not in MARGIN_STRATEGIES:
            raise ValueError(f"margin_strategy must be one of {MARGIN_STRATEGIES}, got {margin_strategy!r}.")
        self.margin_strategy = margin_strategy
        self.margin = check_finite_number(margin, "margin")
        self.contrast_anchors = bool(contrast_anchors)
        self.contrast_positives = bool(contrast_positives)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, margin_strategy={self.margin_strategy!r}, margin={self.margin}, "
                f"contrast_anchors={self.contrast_anchors}, contrast_positives={self.contrast_positives}")

    def forward(
        self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor | None = None, *,
        anchor_guide: torch.Tensor, positive_guide: torch.Tensor, negative_guide: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (negative is None) != (negative_guide is None):
            given, missing = ("negative", "negative_guide") if negative is not None else ("negative_guide", "negative")
            raise ValueError(f"GISTLoss got {given} without {missing}; pass both (the guide judges every negative) or neither.")
        model_inputs = {"anchor": anchor, "positive": positive} | ({} if negative is None else {"negative": negative})
        guide_inputs = {"anchor_guide": anchor_guide, "positive_guide": positive_guide} | (
            {} if negative_guide is None else {"negative_guide": negative_guide})
        check_embeddings(**model_inputs)
        check_embeddings(**guide_inputs)
        n = check_same_rows(anchor=anchor, positive=positive, anchor_guide=anchor_guide, positive_guide=positive_guide)
        if negative is not None:
            check_same_rows(negative=negative, negative_guide=negative_guide)

        a, p = F.normalize(anchor, dim=-1), F.normalize(positive, dim=-1)
        ga, gp = F.normalize(anchor_guide, dim=-1), F.normalize(positive_guide, dim=-1)
        guided_ap = ga @ gp.T  # (N, N)
        threshold = guided_ap.diagonal().unsqueeze(1)  # (N, 1): g(a_i, p_i)
        threshold = threshold - (self.margin if self.margin_strategy == "absolute" else threshold.abs() * self.margin)
        own = torch.eye(n, dtype=torch.bool, device=anchor.device)  # (N, N): p_i, never filtered

        def filtered(similarity: torch.Tensor, guided: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
            false_negatives = guided > threshold
            if keep is not None:
                false_negatives = false_negatives & ~keep
            return similarity.masked_fill(false_negatives, float("-inf"))

        scores = [filtered(a @ p.T, guided_ap, own)]  # (N, N)
        if self.contrast_anchors:
            scores.append(filtered(a @ a.T, ga @ ga.T))  # (N, N)
        if self.contrast_positives:
            scores.append(filtered(p @ p.T, gp @ gp.T))  # (N, N)
        if negative is not None:
            n_, gn = F.normalize(negative, dim=-1), F.normalize(negative_guide, dim=-1)
            scores.append(filtered(a @ n_.T, ga @ gn.T))  # (N, M)
        logits = torch.cat(scores, dim=1) / self.temperature  # (N, N * (1 + anchors + positives) + M)
        return F.cross_entropy(logits, torch.arange(n, device=anchor.device))
