"""GradCache inside PyTorch Lightning: a LightningModule whose `training_step` returns `CachedLoss`'s loss.

Needs `pip install "gradcache[lightning]"`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.cached_loss import CachedLoss
from gradcache.integrations.optional import require
from gradcache.integrations.wrappers import check_wrapper
from gradcache.options import Options, Unpack
from gradcache.strategy import Encoders, LossFn

pl = require("lightning.pytorch", "lightning", "gradcache.integrations.lightning")

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class GradCacheModule(pl.LightningModule):
    """A LightningModule training `encoders` on `loss_fn` over each whole batch, chunk by chunk: the gradient
    of every encoder and loss parameter after Lightning's backward is that of one full-batch step.

    `training_step` returns `CachedLoss`'s loss under automatic optimization, and Lightning's backward runs
    GradCache's second pass. Lightning's own machinery stays in charge and stays exact: `precision=
    "bf16-mixed"` (the second pass re-enters the forward's autocast), `gradient_clip_val` (clipping sees the
    full-batch gradient), `accumulate_grad_batches` (each micro-batch its own batch of in-batch negatives,
    its loss divided by the count), and `strategy="ddp"`, which wraps this whole module in DDP: every rank's
    loss is over the global batch, and gradients synchronise once per optimizer step. A loss with
    `clamp_logit_scale` (ClipLoss) is clamped after every optimizer step.

    Subclass to change how a batch maps to the encoders' inputs (`inputs_of`), what is logged, or the
    optimizer (`configure_optimizers`); or copy the three lines of `training_step` into your own module.

    Strategies: one device, or `"ddp"` / `"ddp_spawn"` / `"ddp_fork"` (with DDP's default
    `find_unused_parameters=False`); FSDP and DeepSpeed strategies, which wrap the whole module, are refused
    at `fit` with a TypeError (shard the encoders with FSDP2's `fully_shard` yourself instead).

    Args:
        encoders, loss_fn, chunk_size, **options: as for `gradcache.CachedLoss`.
        optimizer: builds the optimizer from the parameters, e.g. `lambda p: torch.optim.AdamW(p, lr=1e-4)`;
            None: override `configure_optimizers`.

    Example:
        >>> module = GradCacheModule([image_tower, text_tower], ClipLoss(), chunk_size=64,
        ...                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4))
        >>> L.Trainer(precision="bf16-mixed", strategy="ddp", gradient_clip_val=1.0).fit(module, loader)
    """

    def __init__(
        self,
        encoders: Encoders,
        loss_fn: LossFn,
        chunk_size: int | Sequence[int],
        *,
        optimizer: OptimizerFactory | None = None,
        **options: Unpack[Options],
    ) -> None:
        super().__init__()
        if optimizer is not None and not callable(optimizer):
            raise TypeError(f"optimizer must build an optimizer from parameters (lambda p: AdamW(p)), got {optimizer!r}.")
        self.cached = CachedLoss(encoders, loss_fn, chunk_size, **options)
        self.optimizer_factory = optimizer

    def inputs_of(self, batch: Any) -> tuple[Any, ...]:
        """The encoders' inputs in order: a tuple or list batch as is, a mapping batch's values in order."""
        if isinstance(batch, Mapping):
            return tuple(batch.values())
        if isinstance(batch, (tuple, list)):
            return tuple(batch)
        raise TypeError(
            f"a batch of type {type(batch).__name__} does not say which input goes to which encoder; return a "
            "tuple (images, texts) or a dict from the data loader, or override inputs_of(batch)."
        )

    def on_fit_start(self) -> None:
        """Refuse, on every rank alike and before the first batch, a strategy GradCache cannot run under."""
        check_wrapper(self.trainer.strategy.model, above_the_loss=True, where="GradCacheModule")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.cached(*self.inputs_of(batch))  # phases (1)-(2); Lightning's backward runs (3)
        self.log("train_loss", loss.detach(), prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.cached(*self.inputs_of(batch))  # under no_grad: the full-batch loss, nothing kept
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer_factory is None:
            raise TypeError(
                "GradCacheModule was given no optimizer; pass optimizer=lambda params: torch.optim.AdamW(params, "
                "lr=1e-4), or override configure_optimizers."
            )
        return self.optimizer_factory(self.parameters())

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        clamp = getattr(self.cached.cache.loss_fn, "clamp_logit_scale", None)
        if callable(clamp):
            clamp()
