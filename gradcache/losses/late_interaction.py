"""Late interaction (ColBERT): InfoNCE over MaxSim scores of token embeddings, in-batch and hard negatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradcache.non_finite import NonFiniteEmbeddingError, NonFiniteLossError
from gradcache.token_embeddings import TokenEmbeddings, check_mask_values, checked, padded_to

from .base import LossBase, check_counts
from .checks import CHECK_ROWS
from .precision import compute_dtype, full_precision
from .tiled_maxsim import tiled_maxsim

__all__ = ["LateInteraction"]

QUERY_REDUCTIONS = ("sum", "mean")


class LateInteraction(LossBase):
    """Cross-entropy of each query against every document of the batch by MaxSim, its own positive the target.

    L = -1/N sum_a log( exp(s(q_a, p_a) / t) / sum_b exp(s(q_a, c_b) / t) ),  s(q, d) = sum_i max_j <q_i, d_j>,

    c_b running over the N positives and the N * h hard negatives, i over the query's tokens and j over the
    document's tokens where their masks are True; ``query_reduction="mean"`` divides s by the query's token count.
    The token vectors are scored as given (normalise them in the model, as ColBERT does).

    Paper: Khattab and Zaharia 2020, ColBERT, https://arxiv.org/abs/2004.12832 (with DPR's in-batch and hard
    negatives, as ``InfoNCE``).

    sentence-transformers' ``(Cached)MultiVectorMultipleNegativesRankingLoss`` is this loss (tested against its
    scorer): its ``scale`` is 1 / t (default 1, as t here), its MeanMaxSim scoring ``query_reduction="mean"``.

    Args:
        temperature: t > 0; divides the MaxSim score (ST's ``scale`` = 1 / t).
        query_reduction: "sum" (ColBERT's MaxSim) or "mean" over the query's scored tokens.
        tile_size: None for the dense scores, which materialise (N, N (1 + h), Lq, Ld) token similarities; an
            int to compute forward and backward in blocks of that many queries x ``column_tile_size`` documents,
            keeping only (N,) softmax statistics and recomputing each block in backward: memory
            O(tile_size * column_tile_size * Lq * Ld + N) above the embeddings and their gradients, same value
            and gradients.
        column_tile_size: documents per block, with ``tile_size`` set; None for ``tile_size``.

    Shapes (``forward(query, positive, negatives=None)``), each a ``gradcache.TokenEmbeddings``:
        query: values (N, Lq, D), mask (N, Lq); positive: (N, Lp, D), (N, Lp), row a the positive of query a;
        negatives: optional (N * h, Ln, D), (N * h, Ln), h hard negatives per query, rows a*h .. a*h+h-1
        belonging to query a (every query sees all of them). The masks are those the model returns: True where
        a token counts (ColBERT's query expansion included). Returns a 0-dim tensor in float32 (float64 for
        float64 inputs).

    Raises:
        ValueError: temperature <= 0, an unknown query_reduction, bad tile_size or column_tile_size, mismatched N
            or D, a negatives row count that is not a multiple of N, a mask of another shape than the values'
            (B, L) or holding other than 0 and 1, a row whose mask keeps no token, NaN/inf values where a mask
            is True (NonFiniteEmbeddingError; where it is False a value is ignored, NaN included, and gets a zero
            gradient).
        NonFiniteLossError: finite token vectors so large that their MaxSim scores overflow the compute dtype
            (float32 for float32 and half inputs), which would give a NaN loss.
        TypeError: an input that is not ``TokenEmbeddings``, non-floating values, a floating mask.

    Example:
        >>> loss_fn = LateInteraction(temperature=1.0, tile_size=64)
        >>> query = TokenEmbeddings(F.normalize(torch.randn(8, 32, 128), dim=-1), torch.ones(8, 32, dtype=torch.bool))
        >>> documents = TokenEmbeddings(F.normalize(torch.randn(8, 180, 128), dim=-1), torch.rand(8, 180) < 0.9)
        >>> loss = loss_fn(query, documents)
    """

    hyperparameters = ("temperature", "query_reduction", "tile_size", "column_tile_size")

    def __init__(
        self, temperature: float = 1.0, *, query_reduction: str = "sum", tile_size: int | None = None,
        column_tile_size: int | None = None,
    ) -> None:
        super().__init__(temperature, tile_size=tile_size, column_tile_size=column_tile_size, queue_size=0,
                         queue_warmup=0)
        if query_reduction not in QUERY_REDUCTIONS:
            raise ValueError(
                f"query_reduction must be one of {QUERY_REDUCTIONS} ('sum': ColBERT's MaxSim; 'mean': divided by "
                f"the query's token count), got {query_reduction!r}"
            )
        self.query_reduction = query_reduction

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """n (1 + h) - 1: every document of the batch but the query's positive."""
        check_counts(self, seen, hard_negatives, takes_hard_negatives=True)
        return seen * (1 + hard_negatives) - 1

    def forward(
        self, query: TokenEmbeddings, positive: TokenEmbeddings, negatives: TokenEmbeddings | None = None,
    ) -> torch.Tensor:
        inputs = {"query": query, "positive": positive}
        if negatives is not None:
            inputs["negatives"] = negatives
        inputs = _checked_inputs(inputs)
        dtype = compute_dtype(*(t.values for t in inputs.values()))
        # masked positions are ignored whatever they hold: selected away (not multiplied by the mask, which keeps
        # NaN), so neither the scores nor the gradients ever read them
        scored = {name: _masked_to_zero(token, dtype) for name, token in inputs.items()}
        query, documents = scored["query"], [v for k, v in scored.items() if k != "query"]
        with full_precision(query.values.device):
            scale = 1.0 / self.temperature
            weights = query.mask.to(dtype)  # (N, Lq): each query token's share of s
            if self.query_reduction == "mean":
                weights = weights / weights.sum(dim=1, keepdim=True)
            if self.tile_size is None:
                loss = self._dense(query.values, weights, [tuple(d) for d in documents], scale)
            else:
                loss = tiled_maxsim(query.values, weights, [tuple(d) for d in documents], scale, self.tile_size,
                                    self.column_tile_size).mean()
        _check_finite(inputs, loss, dtype)
        return loss

    @staticmethod
    def _dense(query: torch.Tensor, weights: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]],
               scale: float) -> torch.Tensor:
        longest = max(values.shape[1] for values, _ in parts)
        padded = [padded_to(TokenEmbeddings(values, mask), longest) for values, mask in parts]
        documents = torch.cat([p.values for p in padded])  # (M, Ld, D)
        mask = torch.cat([p.mask for p in padded])  # (M, Ld)
        similarities = torch.einsum("aid,bjd->abij", query, documents)  # (N, M, Lq, Ld)
        best = similarities.masked_fill(~mask[None, :, None, :], float("-inf")).max(dim=3).values  # (N, M, Lq)
        logits = (best * weights[:, None, :]).sum(dim=2) * scale  # (N, M)
        return F.cross_entropy(logits, torch.arange(query.shape[0], device=query.device))


def _checked_inputs(inputs: dict[str, object]) -> dict[str, TokenEmbeddings]:
    """Each input as checked token embeddings (bool masks); raise before any arithmetic on a bad one."""
    out: dict[str, TokenEmbeddings] = {}
    for name, value in inputs.items():
        if not isinstance(value, TokenEmbeddings):
            raise TypeError(
                f"LateInteraction: {name} must be gradcache.TokenEmbeddings(values (B, L, D), mask (B, L)), got "
                f"{type(value).__name__}; return TokenEmbeddings from the encoder (or get_embedding)."
            )
        out[name] = token = checked(value, f"LateInteraction: {name}")
        check_mask_values([token.mask])  # an integer mask's values, which `checked` leaves to its reader
        empty = (~token.mask.any(dim=1)).nonzero().flatten()
        if empty.numel():
            raise ValueError(
                f"LateInteraction: {name} row(s) {empty[:5].tolist()} have no True in their mask; every query and "
                "document needs at least one scored token."
            )
    width = {name: t.values.shape[2] for name, t in out.items()}
    if len(set(width.values())) > 1:
        raise ValueError(f"LateInteraction: the token vectors' widths differ ({width}); project them to one size D.")
    n, positives = out["query"].values.shape[0], out["positive"].values.shape[0]
    if n == 0 or positives != n:
        raise ValueError(
            f"LateInteraction: positive has {positives} rows but query has {n}; row a of positive is the positive "
            "of query a, so both need the same batch size (at least 1)."
        )
    if "negatives" in out and out["negatives"].values.shape[0] % n != 0:
        raise ValueError(
            f"LateInteraction: negatives has {out['negatives'].values.shape[0]} rows, not a multiple of the {n} "
            "queries; pass h hard negatives per query, grouped by query (rows a*h .. a*h+h-1 for query a)."
        )
    return out


def _masked_to_zero(token: TokenEmbeddings, dtype: torch.dtype) -> TokenEmbeddings:
    """`token` in `dtype` with 0 at every masked position: torch.where, whose gradient there is exactly 0."""
    values = token.values.to(dtype)
    return TokenEmbeddings(torch.where(token.mask.unsqueeze(-1), values, values.new_zeros(())), token.mask)


def _check_finite(inputs: dict[str, TokenEmbeddings], loss: torch.Tensor, dtype: torch.dtype) -> None:
    """NonFiniteEmbeddingError for NaN/inf at scored positions; NonFiniteLossError for finite inputs whose loss is
    not finite (their scores overflow `dtype`). One host read for all inputs and the loss."""
    with torch.no_grad():
        counts = [sum((~torch.isfinite(values) & mask.unsqueeze(-1)).sum()
                      for values, mask in zip(token.values.split(CHECK_ROWS), token.mask.split(CHECK_ROWS)))
                  for token in inputs.values()]  # (B, L, D) blocks of CHECK_ROWS rows: NaN/inf where scored
        *bad, loss_bad = torch.stack([*counts, (~torch.isfinite(loss.detach())).sum()]).tolist()  # one sync
    for (name, token), count in zip(inputs.items(), bad):
        if count:
            raise NonFiniteEmbeddingError(f"LateInteraction: {name} has {count} NaN/inf values where its mask is "
                                          f"True (shape {tuple(token.values.shape)})")
    if loss_bad:
        largest = max(float(token.values.detach().abs().where(token.mask.unsqueeze(-1), 0).max()) for token in inputs.values())
        raise NonFiniteLossError(
            f"LateInteraction: the token vectors are finite but their MaxSim scores over the temperature overflow {dtype} (largest "
            f"|value| {largest:.3g}, the largest finite {dtype} is {torch.finfo(dtype).max:.3g}), so the loss is "
            "not finite; normalise the token vectors in the model (ColBERT does), or pass float64 values")
