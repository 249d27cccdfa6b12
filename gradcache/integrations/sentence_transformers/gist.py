"""GradCacheGISTLoss: sentence-transformers' GISTEmbedLoss under GradCache, the counterpart of CachedGISTEmbedLoss."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gradcache.integrations.sentence_transformers.encoders import GuideEncoder, SentenceEncoder, refuse_static_embedding
from gradcache.integrations.sentence_transformers.loss import GradCacheLoss, backward_into, through_calculate_loss
from gradcache.losses import InfoNCE
from gradcache.options import Options, Unpack
from gradcache.vision_inputs import has_vision_keys


class GradCacheGISTLoss(GradCacheLoss):
    """GISTEmbed's guided in-batch negatives over the whole batch at the memory of one chunk:
    `InfoNCE(model(columns), guide=guide(columns))`, by GradCache, with InfoNCE's guided filter (formula in
    `gradcache.losses.guided`): directions query_to_doc (+ query_to_query for `contrast_anchors`, +
    positive_to_positive for `contrast_positives`) in one joint softmax, GISTEmbedLoss's blocks.

    Equals sentence-transformers' `GISTEmbedLoss(model, guide, temperature, margin_strategy, margin,
    contrast_anchors, contrast_positives)`, value and gradient, and `CachedGISTEmbedLoss` at
    `mini_batch_size=chunk_size`. The guide is a frozen tower: phase (1) encodes each of its chunks once, under
    no grad, and nothing re-encodes it; its embeddings are constants of the loss, and its width may differ
    from the model's. A guide with another tokenizer (or a shorter max_seq_length) gets each column decoded
    from the model's tokens and tokenized again, as GISTEmbedLoss does. Composes with MatryoshkaLoss (which
    truncates the model's embeddings, never the guide's) as GradCacheLoss does.

    Args:
        model: the SentenceTransformer being trained.
        guide: a SentenceTransformer whose similarities decide which in-batch candidates are false negatives.
        temperature, margin_strategy, margin, contrast_anchors, contrast_positives: GISTEmbedLoss's, with its
            defaults (0.01, "absolute", 0.0, True, True).
        chunk_size: rows per chunk of every column, the model's and the guide's (CachedGISTEmbedLoss's
            `mini_batch_size`).
        trim_padding, gather_across_devices, show_progress_bar, **options: as for `GradCacheLoss`. With
            `gather_across_devices=True` the loss is GIST over the global batch (every anchor of every rank
            contrasted with every other), where GISTEmbedLoss contrasts anchors with anchors of its own rank.

    Raises:
        TypeError: a guide that is not an nn.Module with a `tokenizer` and `preprocess` (a SentenceTransformer).
        ValueError: bad hyperparameters (see InfoNCE), a model or guide based on a StaticEmbedding, here; at the
            call, other than two or three columns.

    Example:
        >>> loss = GradCacheGISTLoss(model, guide=SentenceTransformer("all-MiniLM-L6-v2"), chunk_size=32)
        >>> SentenceTransformerTrainer(model=model, train_dataset=triplets, loss=loss).train()
    """

    uncached = "GISTEmbedLoss"

    def __init__(
        self, model: nn.Module, guide: nn.Module, temperature: float = 0.01, margin_strategy: str = "absolute",
        margin: float = 0.0, contrast_anchors: bool = True, contrast_positives: bool = True, chunk_size: int = 32,
        *, trim_padding: bool = True, gather_across_devices: bool = False, show_progress_bar: bool = False,
        **options: Unpack[Options],
    ) -> None:
        if not isinstance(guide, nn.Module) or not callable(getattr(guide, "preprocess", None)) \
                or getattr(guide, "tokenizer", None) is None:
            raise TypeError(
                f"guide must be a SentenceTransformer (an nn.Module with a tokenizer), got {type(guide).__name__}; "
                "load it first: guide=SentenceTransformer('all-MiniLM-L6-v2')."
            )
        refuse_static_embedding(guide, type(self).__name__, "guide", "give a guide with a transformers model and "
                                "tokenizer, as GISTEmbedLoss requires")
        directions = ("query_to_doc", *(("query_to_query",) if contrast_anchors else ()),
                      *(("positive_to_positive",) if contrast_positives else ()))
        loss = InfoNCE(temperature, directions=directions, partition_mode="joint", margin_strategy=margin_strategy,
                       margin=margin)
        super().__init__(model, loss, chunk_size, trim_padding=trim_padding, gather_across_devices=gather_across_devices,
                         show_progress_bar=show_progress_bar, **options)
        self.guide = guide  # a child, as in GISTEmbedLoss, so .to(device) moves it; it never receives a gradient
        self.guide_encoder = GuideEncoder(guide, self.progress.tick)
        self.must_retokenize = _must_retokenize(model, guide)
        self._model_tokenizer = (getattr(model, "tokenizer", None),)  # read before the trainer wraps the model

    def check_columns(self, columns: list[Mapping[str, Any]]) -> None:
        if len(columns) not in (2, 3):
            raise ValueError(
                f"GradCacheGISTLoss got {len(columns)} column(s); it takes (anchor, positive) pairs or (anchor, "
                "positive, negative) triplets, as GISTEmbedLoss does: drop the extra columns from the dataset."
            )

    def _encoders(self, columns: int) -> list[nn.Module]:
        model = SentenceEncoder(self.model, self.progress.tick)
        return [model] * columns + [self.guide_encoder] * columns

    def _inputs(self, columns: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The model's columns, then the guide's: the same features, or retokenized for the guide."""
        if not self.must_retokenize:
            return [*columns, *(dict(column) for column in columns)]
        from sentence_transformers.util import batch_to_device

        pictured = [c for c, column in enumerate(columns) if has_vision_keys(column)]
        if pictured:
            raise ValueError(
                f"GradCacheGISTLoss must re-tokenize the model's columns for a guide with another tokenizer (or a "
                f"shorter max_seq_length), and column(s) {pictured} hold images, which decoding the tokens loses; "
                "give a guide with the model's processor and max_seq_length, or text-only columns."
            )
        tokenizer = self._model_tokenizer[0]
        if tokenizer is None:
            raise TypeError(
                "GradCacheGISTLoss must decode the model's tokens for a guide with another tokenizer, but the model "
                "has no tokenizer; give the guide the model's tokenizer, or a model with one."
            )
        texts = [tokenizer.batch_decode(column["input_ids"], skip_special_tokens=True) for column in columns]
        device = next(self.guide.parameters()).device
        return [*columns, *(batch_to_device(self.guide.preprocess(t), device) for t in texts)]

    def _phase_two(self, *embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        columns = len(embeddings) // 2  # the model's columns, then the guide's
        return through_calculate_loss(self.calculate_loss, embeddings[:columns], [[g] for g in embeddings[columns:]],
                                      owner=type(self).__name__)

    def calculate_loss(
        self, reps: list[list[torch.Tensor]], reps_guided: list[list[torch.Tensor]], *, with_backward: bool = False
    ) -> torch.Tensor:
        """CachedGISTEmbedLoss's hook: GIST from the model's `reps` and the guide's `reps_guided`, one list of
        (rows, D) embeddings per column each; with `with_backward`, gradients land in each rep's `.grad`."""
        model_columns = [torch.cat(column) for column in reps]  # anchor, positive[, negative]: (N, D) each
        guide_columns = tuple(torch.cat(column) for column in reps_guided)  # the same rows, (N, D') each
        value = self.loss(*model_columns, guide=guide_columns)
        return backward_into(value, reps, self.loss, with_backward)

    def get_config_dict(self) -> dict[str, Any]:
        return {"guide": type(self.guide).__name__, **super().get_config_dict()}


def _must_retokenize(model: nn.Module, guide: nn.Module) -> bool:
    """GISTEmbedLoss's rule: another vocabulary, or a guide that reads fewer tokens than the model."""
    model_tokenizer, guide_tokenizer = getattr(model, "tokenizer", None), guide.tokenizer
    if model_tokenizer is None:
        return True
    if model_tokenizer.get_vocab() != guide_tokenizer.get_vocab():
        return True
    return getattr(guide, "max_seq_length", 0) < getattr(model, "max_seq_length", 0)
