"""The two strategies GradCache is measured against; same signature, so a benchmark swaps them in one line."""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from gradcache.batchnorm import running_stats_frozen, warn_if_batchnorm_in_chunks
from gradcache.distributed import gather_sizes, gradient_sync, is_distributed, step_reduction
from gradcache.autocast import autocast_off_everywhere
from gradcache.strategy import Strategy


class FullBatch(Strategy):
    """The reference: one forward over the whole batch, the loss, one backward.

    Memory grows with the batch: every activation of every example is alive at once. `chunk_size` is
    accepted and ignored, so the three strategies swap in one line.

    Args: as for `gradcache.strategy.Strategy`.

    Example:
        >>> strategy = FullBatch([image_tower, text_tower], ClipLoss())
        >>> loss = strategy.step(images, tokens)
    """

    chunk_size_required = False

    def step(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Forward and backward over the full batch; accumulate into `.grad`; return the detached loss."""
        self.require_grad_enabled()
        self.check_inputs(inputs)
        loss = self.loss_over(self.embed(inputs), loss_kwargs)
        # checkpointing re-runs forwards in this backward; a DeepSpeed engine reduces once, after it
        with contextlib.ExitStack() as reductions:
            for encoder in self.all_encoders():
                reductions.enter_context(step_reduction(encoder))
            with running_stats_frozen(self.all_encoders()), autocast_off_everywhere():
                self.scaled(loss).backward()
        self.steps_taken += 1
        return loss.detach()


class NaiveAccumulation(Strategy):
    """Plain gradient accumulation: the loss of each micro-batch within that micro-batch, divided by the number
    of micro-batches, and a backward per micro-batch.

    NOT equivalent to a large batch for in-batch negatives: each anchor is only contrasted with its own
    micro-batch (chunk_size - 1 negatives, not N - 1), so the loss is the mean of per-chunk losses and its
    gradient differs from the full-batch gradient. It is the baseline that shows what GradCache is for.
    Micro-batch k takes chunk k of every input, so every input must split into the same number of chunks.

    Example:
        >>> strategy = NaiveAccumulation([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> loss = strategy.step(images, tokens)  # mean of the per-micro-batch losses
    """

    pairs_chunks_across_inputs = True

    def step(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Forward and backward per micro-batch; accumulate into `.grad`; return the mean micro-batch loss."""
        self.require_grad_enabled()
        self.check_inputs(inputs)
        chunks = [self.split(i, v) for i, v in enumerate(inputs)]
        count = self._micro_batch_count(chunks)
        warn_if_batchnorm_in_chunks(self.all_encoders())
        encoders = self.all_encoders()
        losses = []
        with contextlib.ExitStack() as reductions, _HeldGradients(self._parameters()) as held:
            for encoder in encoders:  # a DeepSpeed engine reduces the micro-batches' sum once, at the end
                reductions.enter_context(step_reduction(encoder))
            for k in range(count):
                last = k == count - 1
                with contextlib.ExitStack() as sync:
                    for encoder in encoders:  # synchronise once, on the last micro-batch
                        sync.enter_context(gradient_sync(encoder, last, self.options["fsdp_reduce"]))
                    embeddings = self.embed([c[k] for c in chunks])  # micro-batch k: chunk k of every input
                    loss = self.loss_over(embeddings, loss_kwargs, f" (micro-batch {k + 1} of {count})")
                    if last:  # the synchronising backward all-reduces .grad whole, earlier steps' share included
                        held.add_back()
                    with running_stats_frozen(encoders), autocast_off_everywhere():
                        self.scaled(loss / count).backward()
                losses.append(loss.detach())
        self.steps_taken += 1
        return torch.stack(losses).mean()

    def _micro_batch_count(self, chunks: list[list[Any]]) -> int:
        counts = [len(c) for c in chunks]
        if len(set(counts)) > 1:
            raise ValueError(
                f"inputs split into different numbers of micro-batches ({counts}); micro-batch k takes chunk k of "
                "every input, so give chunk sizes per input that split them into the same number of chunks."
            )
        count = counts[0]
        if self.options["gather"] and is_distributed():
            per_rank = gather_sizes(count, self._device())
            if len(set(per_rank)) > 1:
                raise ValueError(
                    f"ranks hold different numbers of micro-batches ({per_rank}); NaiveAccumulation gathers each "
                    "micro-batch across ranks, so give every rank the same local batch size."
                )
        return count

    def _device(self) -> torch.device:
        for parameter in self._parameters():
            return parameter.device
        return torch.device("cpu")

    def _parameters(self) -> list[nn.Parameter]:
        modules = self.all_encoders() + ([self.loss_fn] if isinstance(self.loss_fn, nn.Module) else [])
        unique = {id(p): p for m in modules for p in m.parameters() if p.requires_grad}
        return list(unique.values())


class _HeldGradients:
    """The `.grad`s held before a step, set aside while its first micro-batches accumulate into fresh ones and
    added back (`add_back`) just before the last micro-batch's backward, the one that synchronises: a caller
    accumulating over steps under its own DDP `no_sync` has its earlier steps' gradients all-reduced with this
    one's, as in plain DDP accumulation. On an error (a non-finite loss in micro-batch 3 of 4, say) exactly the
    `.grad`s held before the step are put back: a held gradient is never written in place.

    Costs nothing when the caller zeroed gradients with set_to_none (the default); otherwise one copy of each
    held `.grad` that the earlier micro-batches did not write (all of them for a step of one micro-batch).
    """

    def __init__(self, parameters: list[nn.Parameter]) -> None:
        self.parameters = parameters
        self.held: list[torch.Tensor | None] = []

    def __enter__(self) -> _HeldGradients:
        self.held = [p.grad for p in self.parameters]
        for p in self.parameters:
            p.grad = None
        return self

    def add_back(self) -> None:
        """.grad = this step's gradient so far + the held one, the held tensor left as it was."""
        for p, grad in zip(self.parameters, self.held):
            if grad is not None:
                p.grad = grad.clone() if p.grad is None else p.grad.add_(grad)

    def __exit__(self, error_type: type[BaseException] | None, *_: Any) -> None:
        if error_type is not None:
            for p, grad in zip(self.parameters, self.held):
                p.grad = grad
