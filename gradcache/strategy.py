"""What GradCache, NaiveAccumulation and FullBatch share: their options, checked once, and the checks on a
step's inputs and loss, made before any gradient is touched."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.distributed import check_fsdp_reduce
from gradcache.distributed import all_gather_with_grad
from gradcache.inputs import GetEmbedding, SplitFn, batch_length, encode, trim_padding
from gradcache.precision import HALF_DTYPES, autocast_context, full_precision, upcast

LossFn = Callable[..., torch.Tensor]
Encoders = nn.Module | Sequence[nn.Module]


class NonFiniteLossError(ValueError):
    """The loss of a step is NaN or infinite; raised before any gradient of that step is written."""


def _check_chunk_size(chunk_size: Any, name: str = "chunk_size") -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"{name} must be an int (or one int per input), got {chunk_size!r}.")
    if chunk_size < 1:
        raise ValueError(f"{name} must be at least 1, got {chunk_size}; use the number of examples per chunk.")


class Strategy:
    """Holds the encoders, the loss and the options; subclasses implement `step(*inputs, **loss_kwargs)`.

    Args:
        encoders: one module shared by every input, or one module per input.
        loss_fn: callable taking the embeddings in input order plus `loss_kwargs`, returning a scalar.
        chunk_size: rows per chunk; an int or one int per input (None: the whole batch at once).
        get_embedding: maps an encoder's output to its (B, D) embedding tensor.
        split_fn: `split_fn(input, chunk_size) -> chunks` for inputs that are not tensors, mappings or sequences.
        trim_padding: drop trailing all-padding columns per chunk of a mapping input with an `attention_mask`.
            Exact only for encoders that ignore masked positions, which cannot be checked: off by default.
        autocast_dtype: torch.bfloat16 or torch.float16 to run the encoders under autocast; the loss and the
            embedding gradients stay in float32.
        scaler: a `torch.amp.GradScaler`; `step` back-propagates `scaler.scale(loss)`, the caller runs
            `scaler.step(optimizer)` and `scaler.update()`.
        gather: under torch.distributed, compute the loss over the embeddings of every rank (the global batch,
            ordered by rank); False keeps each rank's loss local.
        fsdp_reduce: for encoders sharded with FSDP2's `fully_shard`, when gradients are reduce-scattered:
            "chunk" (default) after every chunk's backward, so gradients stay sharded (one reduce-scatter per
            chunk); "step" once per step, keeping unsharded gradients between chunks (one reduce-scatter, the
            memory of whole gradients). Plain and DDP encoders always synchronise once per step. Measured
            trade: benchmarks/results/sharding.md. Under FSDP2 every chunk's forward and backward is a
            collective, so every rank must split its inputs into as many chunks (checked, ValueError).
    """

    def __init__(
        self,
        encoders: Encoders,
        loss_fn: LossFn,
        chunk_size: int | Sequence[int] | None = None,
        *,
        get_embedding: GetEmbedding | None = None,
        split_fn: SplitFn | None = None,
        trim_padding: bool = False,
        autocast_dtype: torch.dtype | None = None,
        scaler: Any | None = None,
        gather: bool = True,
        fsdp_reduce: str = "chunk",
    ) -> None:
        if isinstance(encoders, nn.Module):
            self.encoders: list[nn.Module] | None = None
            self.shared_encoder: nn.Module | None = encoders
        elif isinstance(encoders, Sequence) and encoders and all(isinstance(e, nn.Module) for e in encoders):
            self.encoders, self.shared_encoder = list(encoders), None
        else:
            raise TypeError(
                f"encoders must be an nn.Module or a non-empty sequence of nn.Modules (one per input), got {encoders!r}."
            )
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (an nn.Module or a function), got {loss_fn!r}.")
        if chunk_size is not None:
            if isinstance(chunk_size, Sequence):
                if not chunk_size:
                    raise ValueError("chunk_size is an empty sequence; give an int or one int per input.")
                for i, size in enumerate(chunk_size):
                    _check_chunk_size(size, f"chunk_size[{i}]")
            else:
                _check_chunk_size(chunk_size)
        for name, fn in (("get_embedding", get_embedding), ("split_fn", split_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {fn!r}.")
        if not isinstance(trim_padding, bool):
            raise TypeError(f"trim_padding must be True or False, got {trim_padding!r}.")
        if autocast_dtype is not None and autocast_dtype not in HALF_DTYPES:
            raise ValueError(
                f"autocast_dtype must be torch.bfloat16, torch.float16 or None, got {autocast_dtype!r}."
            )
        if scaler is not None and not (callable(getattr(scaler, "scale", None)) and hasattr(scaler, "update")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {scaler!r}.")
        if not isinstance(gather, bool):
            raise TypeError(f"gather must be True or False, got {gather!r}.")
        check_fsdp_reduce(fsdp_reduce)
        self.loss_fn = loss_fn
        self.chunk_size = chunk_size
        self.get_embedding = get_embedding
        self.split_fn = split_fn
        self.trim_padding = trim_padding
        self.autocast_dtype = autocast_dtype
        self.scaler = scaler
        self.gather = gather
        self.fsdp_reduce = fsdp_reduce
        self.steps_taken = 0

    # --- what a step needs -------------------------------------------------------------------------------
    def encoder_for(self, index: int) -> nn.Module:
        return self.shared_encoder if self.shared_encoder is not None else self.encoders[index]

    def all_encoders(self) -> list[nn.Module]:
        return [self.shared_encoder] if self.shared_encoder is not None else list(self.encoders)

    def chunk_size_for(self, index: int) -> int:
        if isinstance(self.chunk_size, Sequence):
            return self.chunk_size[index]
        return self.chunk_size

    def device_type(self) -> str:
        for encoder in self.all_encoders():
            for parameter in encoder.parameters():
                return parameter.device.type
        return "cpu"

    def require_grad_enabled(self) -> None:
        if not torch.is_grad_enabled():
            raise ValueError(
                f"{type(self).__name__}.step was called with gradients disabled (inside torch.no_grad() or "
                "inference_mode()); it runs a backward pass, so call it with gradients enabled."
            )

    def check_inputs(self, inputs: tuple[Any, ...]) -> list[int | None]:
        """Check a step's inputs before anything runs; return each input's length (None: custom type)."""
        if not inputs:
            raise ValueError("no inputs were given; call step(*inputs) with one input per encoder, e.g. step(images, texts).")
        if self.encoders is not None and len(self.encoders) != len(inputs):
            raise ValueError(
                f"got {len(inputs)} inputs for {len(self.encoders)} encoders; pass one input per encoder, "
                "or a single shared encoder."
            )
        if isinstance(self.chunk_size, Sequence) and len(self.chunk_size) != len(inputs):
            raise ValueError(
                f"chunk_size has {len(self.chunk_size)} entries for {len(inputs)} inputs; give one per input or a single int."
            )
        lengths = [batch_length(value, f"input {i}") for i, value in enumerate(inputs)]
        for i, length in enumerate(lengths):
            if length == 0:
                raise ValueError(f"input {i} is an empty batch (0 examples); a step needs at least one example.")
        return lengths

    def checked_loss(self, loss: Any, where: str = "") -> torch.Tensor:
        """The loss must be a finite scalar tensor; say which step produced it if not."""
        step = self.steps_taken + 1
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(
                f"loss_fn returned {shape} at step {step}{where}; it must return a scalar tensor "
                "(reduce with .mean() or .sum())."
            )
        if not torch.isfinite(loss.detach()).all():
            raise NonFiniteLossError(
                f"loss_fn returned a non-finite loss ({loss.item()}) at step {step}{where}; no gradient was "
                "written. Lower the learning rate, check the inputs for NaN/inf, or use bf16 instead of fp16."
            )
        return loss.reshape(())

    def embed(self, values: Sequence[Any]) -> list[torch.Tensor]:
        """Each input (or its micro-batch) through its encoder in one forward, under the autocast option;
        half-precision embeddings come back as float32 for the loss."""
        with autocast_context(self.autocast_dtype, self.device_type()):
            embeddings = [
                encode(self.encoder_for(i), trim_padding(v) if self.trim_padding else v, self.get_embedding, f"input {i}")
                for i, v in enumerate(values)
            ]
        return [upcast(e) for e in embeddings]

    def loss_over(self, embeddings: list[torch.Tensor], loss_kwargs: dict[str, Any], where: str = "") -> torch.Tensor:
        """The loss over every rank's embeddings (when gathering), in float32 with autocast off, checked."""
        if self.gather:
            embeddings = [all_gather_with_grad(e) for e in embeddings]  # (N_i * world_size, D), rank order
        with full_precision():
            return self.checked_loss(self.loss_fn(*embeddings, **loss_kwargs), where)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss
