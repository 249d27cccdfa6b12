"""GradCache inside the Hugging Face `transformers.Trainer`: the Trainer's model is a `CachedLoss`.

Needs `pip install "gradcache[huggingface]"` (transformers and accelerate, which the Trainer requires).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.cached_loss import CachedLoss
from gradcache.deepspeed_engine import is_deepspeed_engine, reduced_once_above_the_loss
from gradcache.integrations.optional import require
from gradcache.integrations.wrappers import check_wrapper

transformers = require("transformers", "huggingface", "gradcache.integrations.huggingface")
require("accelerate", "huggingface", "transformers.Trainer")


class GradCacheTrainer(transformers.Trainer):
    """A `transformers.Trainer` whose training loss is `CachedLoss`'s: the full-batch contrastive loss of each
    batch, its gradient exactly that of one full-batch step, at the memory of one chunk.

    Give the Trainer the `CachedLoss` as its model. Its `compute_loss` calls that model (or the Trainer's
    DDP wrapper of it) on the batch's entries `input_names`, in order, and the Trainer's own backward runs
    GradCache's second pass. Everything else is the Trainer's: gradient accumulation (each micro-batch is
    its own batch of in-batch negatives, its loss divided by the accumulation count as for any loss),
    `bf16`/`fp16` (the second pass re-enters the forward's autocast), gradient clipping, the optimizer over
    every parameter of the encoders and the loss (a learnable temperature included), and the DDP launch
    (`torchrun`), under which every rank's loss is over the global batch and gradients synchronise once per
    optimizer step. Under DeepSpeed (`TrainingArguments(deepspeed=ds_config)`, ZeRO stage 1, 2 or 3) the engine
    wraps the `CachedLoss`; its backward runs the second pass chunk by chunk and reduces the full batch's gradient
    once, when the last chunk's backward is done (`gradcache.deepspeed_engine.reduced_once_above_the_loss`), and its
    step follows: the step of one process on the global batch.

    Args:
        model: the `CachedLoss` to train.
        args: `TrainingArguments`, with `remove_unused_columns=False` (the batch's entries are the loss's
            inputs, which the Trainer cannot read from `CachedLoss.forward`'s signature); an unset
            `ddp_find_unused_parameters` is set to False, as DDP around the loss needs
            (`gradcache.integrations.wrappers`).
        input_names: the batch entries passed to the loss, in the order of its encoders (e.g.
            `("image", "text")`); None passes every entry of the batch in the collator's order.
        **trainer_kwargs: anything else `transformers.Trainer` takes (`train_dataset`, `data_collator`, ...).

    Raises:
        TypeError: `model` is not a `CachedLoss`, or `input_names` is not a sequence of strings.
        ValueError: `remove_unused_columns` or `ddp_find_unused_parameters` is on; under DeepSpeed, a 0-dim
            parameter (DeepSpeed's engine cannot broadcast one: a learnable temperature); at a step, a batch
            without one of `input_names`, or, before the first forward, a DeepSpeed config that cannot be exact
            (named by its key: ZeRO stage 0, `gradient_accumulation_steps` above 1, fp16 loss scaling; see
            `gradcache.deepspeed_engine.check_deepspeed_engine`). TypeError at a step: a wrapper GradCache
            cannot run in (DataParallel on several GPUs without torchrun, FSDP1).

    Example:
        >>> cached = CachedLoss([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> args = TrainingArguments("runs/clip", remove_unused_columns=False, bf16=True)
        >>> GradCacheTrainer(cached, args, input_names=("image", "text"), train_dataset=pairs,
        ...                  data_collator=collate).train()
    """

    def __init__(
        self,
        model: CachedLoss,
        args: transformers.TrainingArguments,
        *,
        input_names: Sequence[str] | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        if not isinstance(model, CachedLoss):
            raise TypeError(
                f"model must be a gradcache.CachedLoss (the encoders and the loss), got {type(model).__name__}; "
                "wrap your encoders: CachedLoss([image_tower, text_tower], loss_fn, chunk_size=64)."
            )
        if not isinstance(args, transformers.TrainingArguments):
            raise TypeError(f"args must be transformers.TrainingArguments, got {type(args).__name__}.")
        if input_names is not None and (
            isinstance(input_names, str) or not all(isinstance(n, str) for n in input_names) or not input_names
        ):
            raise TypeError(f"input_names must be a non-empty sequence of batch keys, e.g. ('query', 'positive'), got {input_names!r}.")
        if args.ddp_find_unused_parameters:
            raise ValueError(
                "TrainingArguments(ddp_find_unused_parameters=True) fails under DDP ('marked as ready twice'): the "
                "encoders' parameters join the loss's graph only in its backward. Pass ddp_find_unused_parameters=False."
            )
        if args.remove_unused_columns:
            raise ValueError(
                "TrainingArguments(remove_unused_columns=True) would drop every batch entry, since CachedLoss.forward "
                "takes *inputs; pass TrainingArguments(..., remove_unused_columns=False)."
            )
        if args.deepspeed:
            scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
            if scalars:
                raise ValueError(
                    f"TrainingArguments(deepspeed=...) with the 0-dim parameters {scalars}: DeepSpeed's engine "
                    "broadcasts every parameter viewed as bytes, which fails on a 0-dim one (a learnable "
                    "temperature); under DeepSpeed keep the temperature fixed (e.g. ClipLoss(learnable=False))."
                )
        if args.ddp_find_unused_parameters is None:
            args.ddp_find_unused_parameters = False  # the Trainer's default for a plain nn.Module is True
        super().__init__(model=model, args=args, **trainer_kwargs)
        self.input_names = tuple(input_names) if input_names is not None else None
        # The loss is already a mean over the whole batch: the Trainer divides it by the accumulation count.
        self.model_accepts_loss_kwargs = False

    def compute_loss(
        self, model: nn.Module, inputs: Mapping[str, Any], return_outputs: bool = False, **kwargs: Any
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`model(*inputs[name] for name in input_names)`; `model` is the CachedLoss or the Trainer's wrapper of
        it. Keyword arguments the Trainer adds across versions (`num_items_in_batch`) are accepted and unused."""
        check_wrapper(model, above_the_loss=True, where="GradCacheTrainer", deepspeed_coalesced=True)
        if is_deepspeed_engine(model):
            _reduce_once(self.accelerator)
        names = self.input_names if self.input_names is not None else tuple(inputs)
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(
                f"the batch has no entry {missing} (it has {sorted(inputs)}); make the data collator return one "
                f"entry per encoder, or set input_names to the keys it returns."
            )
        loss = model(*(inputs[n] for n in names))
        return (loss, {"loss": loss}) if return_outputs else loss


def _reduce_once(accelerator: Any) -> None:
    """Make accelerate's DeepSpeed backward (`engine.backward(loss)`, then `engine.step()`) reduce once per step."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is None:
        raise TypeError(
            "GradCacheTrainer found a DeepSpeed engine but the Trainer's accelerator holds no "
            "deepspeed_engine_wrapped to run its backward through; pass the DeepSpeed config as "
            "TrainingArguments(deepspeed=...) rather than wrapping the model yourself."
        )
    if not isinstance(wrapped, _ReducedOnce):
        accelerator.deepspeed_engine_wrapped = _ReducedOnce(wrapped)


class _ReducedOnce:
    """accelerate's `DeepSpeedEngineWrapper` with `engine.backward(loss)` inside `reduced_once_above_the_loss`."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped, self.engine = wrapped, wrapped.engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        with reduced_once_above_the_loss(self.engine):
            self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()
