"""GradCache (Gao et al. 2021, https://arxiv.org/abs/2101.06983): the full-batch gradient of a contrastive
loss at the activation memory of one chunk.

One step, read top to bottom:
  (1) encode every chunk of every input without an autograd graph, recording each chunk's random state;
  (2) compute the loss over the full batch (gathered from every rank under torch.distributed) from those
      embeddings, and its gradient with respect to every embedding and every loss parameter: the gradient cache;
  (3) re-encode each chunk with a graph under its recorded random and autocast state, and back-propagate its
      slice of the cached gradient into the encoder, one chunk at a time.

`GradCache.step` runs (1)-(3) at once. `CachedLoss` runs (1)-(2) when called and (3) when `backward()` reaches
it. Both go through `GradCache.loss`: (3) is the backward of an identity function placed between the cached
embeddings and the loss, so whatever multiplies the loss on its way back (a GradScaler's scale, a division by
an accumulation count) multiplies the cached gradients too, in float32, before any cast to half precision.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gradcache.batchnorm import running_stats_frozen, warn_if_batchnorm_in_chunks
from gradcache.distributed import (
    accumulate_without_hooks, check_same_chunk_counts, gradient_sync, holds_its_own_sync,
)
from gradcache.inputs import encode, split, tensors_of, trim_padding
from gradcache.options import Options, Unpack
from gradcache.precision import AutocastState, autocast_context, autocast_off_everywhere, upcast
from gradcache.random_state import RandomState
from gradcache.strategy import Encoders, LossFn, Strategy


class GradCache(Strategy):
    """Full-batch contrastive gradients, computed chunk by chunk.

    Exactly equivalent to `FullBatch.step` on the same batch: the same loss and the same `.grad` on every
    encoder parameter and every `loss_fn` parameter, up to floating-point rounding, with dropout replayed so
    the gradient is that of the loss returned. Not equivalent where the encoder couples examples inside a
    forward: train-mode BatchNorm normalises each chunk with its own statistics (a warning says so).

    Cost: one extra chunked forward pass without a graph, plus the loss over the full batch. Memory: the
    activations of one chunk, plus the (N, D) embeddings and the loss's own buffers.

    Args:
        encoders: one module shared by every input (SimCLR's two views), or one module per input (CLIP's towers).
        loss_fn: callable taking the embeddings in input order plus `loss_kwargs`, returning a scalar.
        chunk_size: examples per chunk, an int or one per input (required); a larger chunk than the batch is
            one chunk.
        **options: the keyword options of every strategy, spelled once in `gradcache.options.Options`.

    Raises:
        ValueError, TypeError: bad options in the constructor; bad inputs, a non-finite or non-scalar loss, or
            gradients disabled in `step`, always before any `.grad` is written.

    Example:
        >>> cache = GradCache([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> loss = cache.step(images, tokens)  # .grad holds the full-batch gradient
        >>> optimizer.step(); optimizer.zero_grad(); loss_fn.clamp_logit_scale()
    """

    def step(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Forward and backward over the full batch; accumulate into `.grad`; return the detached loss."""
        self.require_grad_enabled()
        loss = self.loss(*inputs, **loss_kwargs)
        with autocast_off_everywhere():  # backward outside any caller's autocast, as PyTorch asks; (3) re-enters its own
            self.scaled(loss).backward()  # runs (3) when it reaches the cached embeddings
        return loss.detach()

    def loss(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Phases (1) and (2); the returned loss runs phase (3) when back-propagated."""
        self.check_inputs(inputs)
        building = torch.is_grad_enabled()
        chunks = [self._split(i, value) for i, value in enumerate(inputs)]
        check_same_chunk_counts([self.encoder_for(i) for i in range(len(chunks))], [len(c) for c in chunks])
        if building:
            warn_if_batchnorm_in_chunks(self.all_encoders())

        with autocast_context(self.options["autocast_dtype"], self.device_type()):
            autocast_state = AutocastState.capture()
            embeddings, random_states = self._encode_without_graph(chunks, record=building)  # (1)

        if not building:  # evaluation: the loss and nothing else
            return self.loss_over([upcast(e) for e in embeddings], loss_kwargs)

        cached = [upcast(e).requires_grad_() for e in embeddings]  # (2) leaves that collect the gradient cache
        replay = _Replay(self, chunks, random_states, autocast_state, [e.dtype for e in embeddings])
        bridged = _ReencodeOnBackward.apply(replay, *cached)
        loss = self.loss_over(list(bridged), loss_kwargs)
        self.steps_taken += 1
        return loss

    # --- the phases --------------------------------------------------------------------------------------
    def _split(self, index: int, value: Any) -> list[Any]:
        chunks = split(value, self.chunk_size_for(index), self.options["split_fn"])
        return [trim_padding(c) for c in chunks] if self.options["trim_padding"] else chunks

    def _encode_without_graph(
        self, chunks: list[list[Any]], record: bool
    ) -> tuple[list[torch.Tensor], list[list[RandomState]]]:
        """(1) Inputs in order, each input's chunks in order, so a seeded run is reproducible."""
        embeddings, random_states = [], []
        with torch.no_grad():
            for i, input_chunks in enumerate(chunks):
                encoder, pieces, states = self.encoder_for(i), [], []
                for chunk in input_chunks:
                    if record:
                        states.append(RandomState.capture(tensors_of(chunk)))
                    pieces.append(encode(encoder, chunk, self.options["get_embedding"], f"input {i}"))
                embeddings.append(torch.cat(pieces))  # (N_i, D)
                random_states.append(states)
        return embeddings, random_states

    def reencode_and_backward(self, replay: _Replay, cached_gradients: Sequence[torch.Tensor]) -> None:
        """(3) Re-encode chunk by chunk with a graph and back-propagate each chunk's cached gradient.

        A step synchronises gradients once. A DDP or FSDP2 encoder holds its synchronisation off itself for every
        chunk but its last (`gradient_sync`). Any other encoder may sit under a DDP wrapper of the whole model
        (Lightning, the Hugging Face Trainer), which decided at its forward that this backward synchronises:
        every chunk but the encoder's last reaches `.grad` without firing DDP's hooks, and the last chunk's
        ordinary backward fires each hook once, so DDP all-reduces the accumulated sum. BatchNorm buffers leave
        as phase (1) left them.
        """
        last_chunk, later = _last_uses(self, replay.chunks)
        with running_stats_frozen(self.all_encoders()), torch.enable_grad():
            for i, input_chunks in enumerate(replay.chunks):
                encoder = self.encoder_for(i)
                own_sync = holds_its_own_sync(encoder)
                parameters = [] if own_sync else _trainable(encoder)
                offset = 0
                for k, chunk in enumerate(input_chunks):
                    last = last_chunk[id(encoder)] == (i, k)
                    with gradient_sync(encoder, last, self.options["fsdp_reduce"]):
                        with replay.random_states[i][k].replay(), replay.autocast_state.apply():
                            embedding = encode(encoder, chunk, self.options["get_embedding"], f"input {i}")
                        rows = embedding.shape[0]
                        gradient = cached_gradients[i][offset : offset + rows].to(embedding.dtype)  # (rows, D)
                        offset += rows
                        if own_sync:
                            embedding.backward(gradient)
                        elif not last:
                            accumulate_without_hooks(embedding, gradient, parameters)
                        else:  # parameters tied to an encoder that runs later fire their hooks there
                            tied = [p for p in parameters if id(p) in later[id(encoder)]]
                            final = [p for p in parameters if id(p) not in later[id(encoder)]]
                            accumulate_without_hooks(embedding, gradient, tied, retain_graph=bool(final))
                            if final:
                                embedding.backward(gradient, inputs=final if tied else None)


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _last_uses(cache: GradCache, chunks: list[list[Any]]) -> tuple[dict[int, tuple[int, int]], dict[int, set[int]]]:
    """Each encoder's last chunk (input, chunk), and for each encoder the ids of its parameters that a
    distinct encoder whose last chunk comes later also holds (tied weights)."""
    last_chunk = {id(cache.encoder_for(i)): (i, len(c) - 1) for i, c in enumerate(chunks)}
    order = sorted(last_chunk, key=last_chunk.__getitem__)
    encoders = {id(e): e for e in cache.all_encoders()}
    later: dict[int, set[int]] = {}
    seen_after: set[int] = set()
    for key in reversed(order):
        own = {id(p) for p in _trainable(encoders[key])}
        later[key] = own & seen_after
        seen_after |= own
    return last_chunk, later


class _Replay:
    """What phase (3) needs from phases (1) and (2), kept by the autograd graph until backward."""

    def __init__(self, cache: GradCache, chunks, random_states, autocast_state, dtypes) -> None:
        self.cache, self.chunks, self.random_states = cache, chunks, random_states
        self.autocast_state, self.dtypes = autocast_state, dtypes


class _ReencodeOnBackward(torch.autograd.Function):
    """Identity on the cached embeddings; its backward receives d loss / d embedding and runs phase (3)."""

    @staticmethod
    def forward(ctx, replay: _Replay, *embeddings: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.replay = replay
        return tuple(e.view_as(e) for e in embeddings)

    @staticmethod
    def backward(ctx, *gradients: torch.Tensor) -> tuple[None, ...]:
        replay, ctx.replay = ctx.replay, None  # a second backward through the same loss has nothing to replay
        if replay is None:
            raise RuntimeError(
                "this GradCache loss was already back-propagated; phase (3) runs once per loss. Compute a new "
                "loss for the next backward."
            )
        replay.cache.reencode_and_backward(replay, gradients)
        return (None,) * (1 + len(gradients))


class CachedLoss(nn.Module):
    """GradCache as a loss: `loss = cached(*inputs)` runs phases (1)-(2); `loss.backward()` runs phase (3).

    For training loops that own the backward call (Lightning, the Hugging Face Trainer, a loop with a
    GradScaler): `scaler.scale(loss).backward()` and `(loss / k).backward()` work as for any loss, since the
    incoming gradient multiplies the cached gradients in float32. Gradients equal those of `FullBatch.step`,
    also when a DDP wrapper holds the whole model (see `GradCache.reencode_and_backward`). Called with
    gradients disabled (an evaluation loop), it returns the loss and keeps nothing. Each call keeps its own
    batch for its backward, so two calls before one backward cannot mix batches.

    Args:
        encoders, loss_fn, chunk_size, **options: as for `GradCache`, except `scaler`: the caller scales the
            loss it back-propagates, so a scaler given here could only be ignored, and is refused (TypeError).

    Example:
        >>> cached = CachedLoss([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> loss = cached(images, tokens)
        >>> scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    """

    def __init__(
        self, encoders: Encoders, loss_fn: LossFn, chunk_size: int | Sequence[int] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if options.get("scaler") is not None:
            raise TypeError(
                f"CachedLoss got scaler={options['scaler']!r}, which it cannot honour: the caller owns the "
                "backward, so scale there: scaler.scale(loss).backward(). Drop the scaler argument (or use "
                "GradCache(..., scaler=scaler).step, which runs the backward itself)."
            )
        super().__init__()
        self.cache = GradCache(encoders, loss_fn, chunk_size, **options)
        self.encoders = nn.ModuleList(self.cache.all_encoders())  # so .to(), .parameters() and .train() reach them
        if isinstance(loss_fn, nn.Module):
            self.loss_fn = loss_fn

    def forward(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        return self.cache.loss(*inputs, **loss_kwargs)
