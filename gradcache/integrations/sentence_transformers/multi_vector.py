"""GradCacheMultiVectorLoss: sentence-transformers' multi-vector (ColBERT) ranking loss under GradCache, the
counterpart of CachedMultiVectorMultipleNegativesRankingLoss, with the tiled MaxSim of `LateInteraction`."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gradcache.integrations.sentence_transformers.encoders import SentenceEncoder
from gradcache.integrations.sentence_transformers.loss import GradCacheLoss, backward_into, through_calculate_loss
from gradcache.integrations.sentence_transformers.spellings import PeerSpellings, count_of, temperature_of
from gradcache.losses import LateInteraction
from gradcache.options import Options, Unpack
from gradcache.token_embeddings import TokenEmbeddings, join, padded_to

PEER = "CachedMultiVectorMultipleNegativesRankingLoss"
MAXSIM_REDUCTIONS = {"maxsim": "sum", "meanmaxsim": "mean"}  # a MultiVectorEncoder's similarity_fn_name


def token_embeddings(output: Mapping[str, Any]) -> TokenEmbeddings:
    """A MultiVectorEncoder's (B, L, D) "token_embeddings" with its scoring mask: after MultiVectorMask,
    "attention_mask" holds the positions scored (query expansion in, skiplisted tokens out)."""
    if not isinstance(output, Mapping) or "token_embeddings" not in output or "attention_mask" not in output:
        found = sorted(output) if isinstance(output, Mapping) else type(output).__name__
        raise TypeError(
            f"GradCacheMultiVectorLoss needs the model's 'token_embeddings' and 'attention_mask' outputs, got {found}; "
            "pass a sentence-transformers MultiVectorEncoder (its modules end with MultiVectorMask and Normalize)."
        )
    return TokenEmbeddings(output["token_embeddings"], output["attention_mask"].bool())


class TaskEncoder(SentenceEncoder):
    """A MultiVectorEncoder (or the trainer's wrapper of it) as a GradCache encoder: the column's "task" entry
    ("query" or "document") goes to the model as its `task` keyword, which MultiVectorMask and the query
    expansion read, as the peer's `self.model(features, task=task)`."""

    def forward(self, **features: Any) -> Any:
        task = features.pop("task", None)
        output = self.model(dict(features), task=task)
        self.on_forward()
        return output


class GradCacheMultiVectorLoss(PeerSpellings, GradCacheLoss):
    """ColBERT's in-batch ranking loss over the whole batch at the memory of one chunk:
    `LateInteraction(temperature)(model(query), model(positive), model(negatives))`, by GradCache.

    L = -1/N sum_a log( exp(s(q_a, p_a) / t) / sum_b exp(s(q_a, c_b) / t) ),  s(q, d) = sum_i max_j <q_i, d_j>

    over the scored tokens (the model's scoring mask), c_b running over every positive and hard negative of the
    batch. Equals sentence-transformers' `MultiVectorMultipleNegativesRankingLoss(model, scale=1 / t)` in value
    and gradient, and its defaults are `CachedMultiVectorMultipleNegativesRankingLoss`'s: scale 1
    (temperature 1), chunks of 32 rows, each chunk's trailing padding trimmed but ColBERT's query-expansion
    positions kept, column 0 encoded with task "query" and the others with "document" (unless the collator
    stamped a task), MaxSim summed over query tokens, or averaged for a model whose `similarity_fn_name` is
    "meanmaxsim". The MaxSim scores are computed in blocks of `tile_size` queries x `column_tile_size`
    documents, forward and backward (`gradcache.losses.LateInteraction`), so the (N, N (1 + h), Lq, Ld) token
    similarities never exist whole: the loss's own memory is flat in N. The peer computes its scores in float32
    whatever the model's dtype; this loss computes them in the embeddings' dtype (float64 stays float64).

    Works inside `MultiVectorMatryoshkaLoss(model, GradCacheMultiVectorLoss(...), dims)`: phase (2) runs
    through `calculate_loss(reps, masks_chunks, with_backward=...)`, the peer's hook, which the modifier decorates.

    Both spellings of the peer's options are accepted, in any combination that agrees: `temperature` or `scale`
    (= 1 / temperature), `chunk_size` or `mini_batch_size`, `tile_size` or `score_mini_batch_size`.

    Args:
        model: the sentence-transformers MultiVectorEncoder being trained.
        temperature: t > 0 dividing the MaxSim scores (default 1.0); or `scale` = 1 / t.
        chunk_size: rows per chunk of every column (default 32); or `mini_batch_size`.
        tile_size: queries per MaxSim block (default 32); or `score_mini_batch_size`.
        column_tile_size: documents per MaxSim block; None for `tile_size`.
        query_reduction: "sum" (MaxSim) or "mean" (MeanMaxSim); None (default) follows the model's
            `similarity_fn_name`.
        similarity_fct: only None (the model's MaxSim or MeanMaxSim) is supported; another scorer (XTR) cannot
            be tiled exactly.
        trim_padding, gather_across_devices, show_progress_bar, **options: as for `GradCacheLoss`.

    Raises:
        ValueError: both spellings of one option with different values (naming both), a chunk size below 1,
            t <= 0, bad tile sizes or query_reduction; at the call, fewer than two columns.
        TypeError: a `similarity_fct` other than None; `mini_batch_num_tokens` (spelled `chunk_tokens` here, which
            counts padded tokens); at the call, a model whose output has no
            "token_embeddings" and "attention_mask".

    Example:
        >>> loss = GradCacheMultiVectorLoss(model, mini_batch_size=16)  # CMVMNRL's spelling, or chunk_size=16
        >>> MultiVectorEncoderTrainer(model=model, train_dataset=triplets, loss=loss).train()
    """

    def __init__(
        self, model: nn.Module, *, temperature: float | None = None, scale: float | None = None,
        chunk_size: int | None = None, mini_batch_size: int | None = None, tile_size: int | None = None,
        score_mini_batch_size: int | None = None, column_tile_size: int | None = None,
        query_reduction: str | None = None, similarity_fct: Any = None, trim_padding: bool = True,
        gather_across_devices: bool = False, show_progress_bar: bool = False, **options: Unpack[Options],
    ) -> None:
        if similarity_fct is not None:
            raise TypeError(
                f"GradCacheMultiVectorLoss got similarity_fct={similarity_fct!r}; it scores with the model's MaxSim "
                "(or MeanMaxSim, set by model.similarity_fn_name), tiled exactly. Drop similarity_fct, or use "
                f"sentence-transformers' {PEER} for another scorer (XTR)."
            )
        if "mini_batch_num_tokens" in options:
            raise TypeError(
                f"GradCacheMultiVectorLoss got mini_batch_num_tokens={options['mini_batch_num_tokens']!r}, the peer's "
                "chunks packed by real tokens in row order; here chunk_tokens=... bounds rows x padded length per "
                "chunk, rows sorted by length (also exact). Pass chunk_tokens instead."
            )
        owner = type(self).__name__
        temperature = temperature_of(owner, temperature, scale, 1.0)
        chunk_size = count_of(owner, "chunk_size", chunk_size, "mini_batch_size", mini_batch_size, 32)
        tile_size = count_of(owner, "tile_size", tile_size, "score_mini_batch_size", score_mini_batch_size, 32)
        if query_reduction is None:
            name = str(getattr(model, "similarity_fn_name", "maxsim"))
            query_reduction = MAXSIM_REDUCTIONS.get(name, "sum")
        loss = LateInteraction(temperature, query_reduction=query_reduction, tile_size=tile_size,
                               column_tile_size=column_tile_size)
        options = {"get_embedding": token_embeddings, **options}
        super().__init__(model, loss, chunk_size, trim_padding=trim_padding,
                         gather_across_devices=gather_across_devices, show_progress_bar=show_progress_bar, **options)

    def _encoders(self, columns: int) -> nn.Module:
        return TaskEncoder(self.model, self.progress.tick)

    def _inputs(self, columns: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Each column with its task, as the peer stamps it: the collator's, else "query" for column 0 and
        "document" for the others (a per-batch setting every chunk gets whole)."""
        return [{**column, "task": column.get("task", "query" if i == 0 else "document")}
                for i, column in enumerate(columns)]

    def _phase_two(self, *embeddings: TokenEmbeddings, labels: torch.Tensor | None = None) -> torch.Tensor:
        return through_calculate_loss(self.calculate_loss, [e.values for e in embeddings],
                                      [[e.mask] for e in embeddings], owner=type(self).__name__)

    def calculate_loss(
        self, reps: list[list[torch.Tensor]], masks_chunks: list[list[torch.Tensor]], *, with_backward: bool = False,
    ) -> torch.Tensor:
        """The peer's cached-loss hook: the loss over the batch from `reps`, one list of (rows, L_k, D) token
        embeddings per column, and their scoring masks `masks_chunks` (rows, L_k); with `with_backward`, their
        gradients land in each rep's `.grad`."""
        columns = [join([TokenEmbeddings(r, m.bool()) for r, m in zip(rep, mask)], f"column {c}")
                   for c, (rep, mask) in enumerate(zip(reps, masks_chunks))]
        query, positive, *negatives = columns
        value = self.loss(query, positive, _grouped_by_query(negatives))
        return backward_into(value, reps, self.loss, with_backward)

    def get_config_dict(self) -> dict[str, Any]:
        """What sentence-transformers writes into the model card."""
        return {"scale": self.scale, "mini_batch_size": self.chunk_size, **super().get_config_dict()}


def _grouped_by_query(columns: list[TokenEmbeddings]) -> TokenEmbeddings | None:
    """Hard-negative columns, each (N, L_c, D), as LateInteraction's negatives (N * h, max L_c, D) grouped by query:
    rows a*h .. a*h+h-1 are query a's."""
    if not columns:
        return None
    longest = max(c.values.shape[1] for c in columns)
    padded = [padded_to(c, longest) for c in columns]
    n, _, width = padded[0].values.shape
    values = torch.stack([p.values for p in padded], dim=1).reshape(-1, longest, width)  # (N, h, L, D) -> (N h, L, D)
    mask = torch.stack([p.mask for p in padded], dim=1).reshape(-1, longest)  # (N, h, L) -> (N h, L)
    return TokenEmbeddings(values, mask)
