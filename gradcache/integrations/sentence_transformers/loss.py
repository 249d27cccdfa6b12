"""GradCache as a sentence-transformers loss, for `SentenceTransformerTrainer` and `model.fit`.

Needs `pip install "gradcache[sentence-transformers]"`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from gradcache.cache import GradCache
from gradcache.integrations.optional import require
from gradcache.integrations.wrappers import check_wrapper
from gradcache.losses import InfoNCE
from gradcache.options import Options, Unpack

require("sentence_transformers", "sentence-transformers", "gradcache.integrations.sentence_transformers")


def sentence_embedding(output: Mapping[str, Any]) -> torch.Tensor:
    """The (B, D) embedding a SentenceTransformer returns under "sentence_embedding"."""
    return output["sentence_embedding"]


class _SentenceEncoder(nn.Module):
    """A SentenceTransformer, or the trainer's wrapper of it, as a GradCache encoder: GradCache passes a chunk
    of a mapping input as keyword arguments, a SentenceTransformer takes the features as one dict (which may
    hold non-tensor entries such as "modality"). A DDP wrapper's `no_sync` is exposed so phase (3)
    synchronises once per step."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        if callable(getattr(model, "no_sync", None)):
            self.no_sync = model.no_sync

    def forward(self, **features: Any) -> Any:
        return self.model(dict(features))


def _columns_to_loss(loss: nn.Module, anchor: torch.Tensor, positive: torch.Tensor, *negatives: torch.Tensor):
    """Columns (anchor, positive, negative 1, ..., negative h), each (N, D), as `loss(anchor, positive)` or
    `loss(anchor, positive, negatives)` with negatives (N * h, D) grouped by query, InfoNCE's signature."""
    if not negatives:
        return loss(anchor, positive)
    grouped = torch.stack(negatives, dim=1).reshape(-1, anchor.shape[-1])  # (N, h, D) -> (N * h, D)
    return loss(anchor, positive, grouped)


class GradCacheLoss(nn.Module):
    """The loss over the whole batch at the memory of one chunk: `loss(model(col) for col in columns)`,
    computed by GradCache (the trainer's `backward()` runs the second, chunked pass).

    With `InfoNCE(temperature=t)` it equals sentence-transformers' `MultipleNegativesRankingLoss(model,
    scale=1 / t)` (cosine similarity; every anchor against every positive and hard negative in the batch),
    value and gradient, and `CachedMultipleNegativesRankingLoss` at any `mini_batch_size`. The batch
    arrives as the trainer's columns (anchor, positive, hard negative 1, ..., h); each column is split into
    chunks of `chunk_size` rows. `self.model` is read on every call, since the trainer replaces it by its
    DDP or compiled wrapper on its first `compute_loss`; the wrapper's gradients are synchronised once per
    step. Labels are ignored, as MultipleNegativesRankingLoss ignores them.

    Args:
        model: the SentenceTransformer being trained.
        loss: called as `loss(anchor, positive)` on two columns, or `loss(anchor, positive, negatives)` with
            negatives (N * h, D) grouped by query on more: `gradcache.losses.InfoNCE` (default, temperature
            0.05, i.e. scale 20), or `ClipLoss` / `SigLipLoss` on two columns. Its parameters (a learnable
            temperature) are trained too: the trainer's optimizer reads the loss's parameters.
        chunk_size: rows per chunk of every column; memory is that of one chunk's activations.
        **options: every option of `gradcache.GradCache` (`trim_padding`, `chunk_tokens`, `memory_budget`,
            `autocast_dtype`, `gather`, ...; `gradcache.options.Options`) but `scaler`, since the trainer owns
            the backward; `get_embedding` defaults to picking "sentence_embedding" from the model's output.

    Raises:
        TypeError, ValueError: bad options, here; at the call, fewer than two columns (ValueError) or a model
            wrapper GradCache cannot run in (TypeError: DataParallel, FSDP1, DeepSpeed; see
            `gradcache.integrations.wrappers`).

    Example:
        >>> loss = GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=32)
        >>> SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss).train()
    """

    def __init__(
        self, model: nn.Module, loss: nn.Module | None = None, chunk_size: int = 32, **options: Unpack[Options]
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a SentenceTransformer (an nn.Module), got {type(model).__name__}.")
        if options.get("scaler") is not None:
            raise TypeError(
                "GradCacheLoss got a scaler, which it cannot honour: the trainer owns the backward and scales the "
                "loss itself (fp16=True in the training arguments). Drop the scaler argument."
            )
        self.model = model  # a child named "model": the trainer's override_model_in_loss swaps it for its wrapper
        self.loss = loss if loss is not None else InfoNCE(temperature=0.05)
        self.chunk_size = chunk_size
        self.options = {"get_embedding": sentence_embedding, **options}
        self._strategy(model)  # checks chunk_size and every option now, before any batch

    def _strategy(self, model: nn.Module) -> GradCache:
        return GradCache(_SentenceEncoder(model), self._column_loss, self.chunk_size, **self.options)

    def _column_loss(self, *columns: torch.Tensor) -> torch.Tensor:
        return _columns_to_loss(self.loss, *columns)

    def forward(self, sentence_features: Iterable[Mapping[str, Any]], labels: torch.Tensor | None = None) -> torch.Tensor:
        columns = list(sentence_features)
        if len(columns) < 2:
            raise ValueError(
                f"GradCacheLoss got {len(columns)} column(s); it needs (anchor, positive) and optionally hard "
                "negatives: give the dataset at least two text columns besides any label column."
            )
        check_wrapper(self.model, above_the_loss=False, where="GradCacheLoss")
        return self._strategy(self.model).loss(*columns)

    def get_config_dict(self) -> dict[str, Any]:
        """What sentence-transformers writes into the model card."""
        options = {k: v for k, v in self.options.items() if k != "get_embedding"}
        return {"loss": repr(self.loss), "chunk_size": self.chunk_size, **options}

    @property
    def citation(self) -> str:
        return (
            "@inproceedings{gao2021scaling, title={Scaling Deep Contrastive Learning Batch Size under Memory "
            "Limited Setup}, author={Gao, Luyu and Zhang, Yunyi and Han, Jiawei and Callan, Jamie}, "
            "booktitle={RepL4NLP}, year={2021}, url={https://arxiv.org/abs/2101.06983}}"
        )
