"""What GradCache, NaiveAccumulation and FullBatch share: the encoders, the loss, the options (spelled in
gradcache/options.py), and the checks on a step's inputs and loss, made before any gradient is touched."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from gradcache.chunks import Chunks
from gradcache.deepspeed_engine import check_deepspeed_engine
from gradcache.distributed import all_gather_embedding
from gradcache.inputs import (
    GetEmbedding, SplitFn, batch_length, encode, is_pair, layout_of, own_images, split, trim_padding,
)
from gradcache.non_finite import NonFiniteLossError
from gradcache.options import Options, Unpack, checked
from gradcache.ranges import is_int
from gradcache.autocast import autocast_context, autocast_off_everywhere, compute_device_type, upcast
from gradcache.token_chunks import has_token_mask
from gradcache.token_embeddings import Embedding, values_of, with_values
from gradcache.vision_inputs import VisionHints, VisionLayout, has_vision_keys, hints_of, positions_from_mask

LossFn = Callable[..., torch.Tensor]
Encoders = nn.Module | Sequence[nn.Module]


def _check_chunk_size(chunk_size: Any, name: str = "chunk_size") -> None:
    if not is_int(chunk_size):
        raise TypeError(f"{name} must be an int (or one int per input), got {chunk_size!r}.")
    if chunk_size < 1:
        raise ValueError(f"{name} must be at least 1, got {chunk_size}; use the number of examples per chunk.")


class Strategy:
    """Holds the encoders, the loss and the options; subclasses implement `step(*inputs, **loss_kwargs)`.

    Args:
        encoders: one module shared by every input, or one module per input.
        loss_fn: callable taking the embeddings in input order plus `loss_kwargs`, returning a scalar; one argument
            per embedding (an encoder, or `get_embedding`, returning a tuple of several gives several).
        chunk_size: rows per chunk; an int or one int per input. Required where `chunk_size_required`;
            accepted and ignored otherwise (FullBatch), so the strategies swap in one line.
        **options: the keyword options, spelled once in `gradcache.options.Options` (get_embedding, split_fn,
            trim_padding, autocast_dtype, scaler, gather, fsdp_reduce, memory_budget, chunk_tokens,
            check_recompute, sparse_cache, reuse_outputs); checked before anything runs. A strategy that `pairs_chunks_across_inputs` refuses
            chunk_tokens.
    """

    chunk_size_required: ClassVar[bool] = True
    pairs_chunks_across_inputs: ClassVar[bool] = False  # micro-batch k holds chunk k of every input

    def __init__(
        self, encoders: Encoders, loss_fn: LossFn, chunk_size: int | Sequence[int] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if not self.chunk_size_required:
            chunk_size = None
        elif chunk_size is None:
            raise TypeError("chunk_size must be an int (or one int per input), got None.")
        if isinstance(encoders, nn.Module):
            self.encoders: list[nn.Module] | None = None
            self.shared_encoder: nn.Module | None = encoders
        elif isinstance(encoders, Sequence) and encoders and all(isinstance(e, nn.Module) for e in encoders):
            self.encoders, self.shared_encoder = list(encoders), None
        else:
            raise TypeError(
                f"encoders must be an nn.Module or a non-empty sequence of nn.Modules (one per input), got {encoders!r}."
            )
        for encoder in self.all_encoders():
            check_deepspeed_engine(encoder)  # a config that cannot be exact, named by its key
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
        self.options: Options = checked(options)
        if self.pairs_chunks_across_inputs and self.options["chunk_tokens"] is not None:
            raise ValueError(
                f"{type(self).__name__} does not take chunk_tokens={self.options['chunk_tokens']!r}: its micro-batch "
                "k must hold the same examples of every input, and token chunks sort each input by its own "
                "lengths. Drop chunk_tokens (use trim_padding=True), or use GradCache."
            )
        self.loss_fn = loss_fn
        self.chunk_size = chunk_size
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

    def split_fn_for(self, index: int) -> SplitFn | None:
        return _for_input(self.options["split_fn"], index)

    def get_embedding_for(self, index: int) -> GetEmbedding | None:
        return _for_input(self.options["get_embedding"], index)

    def split(self, index: int, value: Any) -> list[Any]:
        """Input `index` in chunks of its chunk size, by its `split_fn` where one is given."""
        return split(value, self.chunk_size_for(index), self.split_fn_for(index), f"input {index}",
                     self.vision_hints(index, value))

    def vision_hints(self, index: int, value: Any) -> VisionHints | None:
        """For a VLM processor's batch (or chunks holding one): the image and video token ids (the options, else
        the encoder's config) and the patch side, which tell its rows' images apart; None for any other input."""
        chunks = value if isinstance(value, Chunks) else [value]
        if not any(has_vision_keys(chunk) for chunk in chunks):
            return None
        return hints_of(self.encoder_for(index), self.options["image_token_id"], self.options["video_token_id"])

    def vision_layout(self, index: int, value: Any) -> VisionLayout | None:
        """Input `index`'s vision layout (gradcache/vision_inputs.py), None where it holds no VLM batch."""
        hints = self.vision_hints(index, value)
        return layout_of(value, f"input {index}", hints) if hints is not None else None

    def trims_leading(self, index: int, value: Any) -> bool:
        """Whether trimming input `index` may drop leading padding too: exact where its encoder takes positions
        from the mask (Qwen2-VL) or the input carries its `position_ids`, cut alike."""
        keywords = value[1] if is_pair(value) else value
        if isinstance(keywords, Mapping) and isinstance(keywords.get("position_ids"), torch.Tensor) and (
                keywords["position_ids"].dim() == 2):
            return True
        return positions_from_mask(self.encoder_for(index))

    def device_type(self) -> str:
        """The device type the encoders compute on (autocast's), from their first parameter
        (`compute_device_type`: a CPU-offloaded FSDP2 shard computes on its mesh's GPU)."""
        for encoder in self.all_encoders():
            for parameter in encoder.parameters():
                return compute_device_type(parameter)
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
        tokens = self.options["chunk_tokens"]
        if isinstance(tokens, Sequence) and len(tokens) != len(inputs):
            raise ValueError(
                f"chunk_tokens has {len(tokens)} entries for {len(inputs)} inputs; give one per input (None where "
                "it does not apply) or a single int."
            )
        for name, none_means in (("split_fn", "the library splits"), ("get_embedding", "the output is the embedding")):
            value = self.options[name]
            if not (value is None or callable(value)) and len(value) != len(inputs):
                raise ValueError(f"{name} has {len(value)} entries for {len(inputs)} inputs; give one per input (None "
                                 f"where {none_means}) or a single callable.")
        for i, value in enumerate(inputs):
            wanted = tokens[i] if isinstance(tokens, Sequence) else tokens
            chunked = self.chunk_size_required  # FullBatch ignores chunk_tokens, as it ignores chunk_size
            if wanted is not None and chunked and self.split_fn_for(i) is not None:
                raise ValueError(
                    f"chunk_tokens={wanted} and split_fn both apply to input {i}, and each would decide its chunks; "
                    "give one of them per input, e.g. chunk_tokens=[None, 4096] with split_fn=[split_images, None]."
                )
            if wanted is not None and chunked and not has_token_mask(value):
                raise ValueError(
                    f"chunk_tokens={wanted} applies to input {i}, which is not a mapping with a 2-D attention_mask; "
                    "give one value per input with None for this one, e.g. chunk_tokens=[None, 4096]."
                )
        lengths = [batch_length(value, f"input {i}", self.split_fn_for(i) is not None, self.vision_hints(i, value))
                   for i, value in enumerate(inputs)]
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

    def embed(self, values: Sequence[Any]) -> list[Embedding]:
        """Each input (or its micro-batch) through its encoder in one forward, under the autocast option: the
        loss arguments, one per embedding in input order (an encoder returning several gives several);
        half-precision embeddings (token values) come back as float32 for the loss."""
        embeddings = []
        with autocast_context(self.options["autocast_dtype"], self.device_type()):
            trim = self.options["trim_padding"]
            for i, v in enumerate(values):
                encoder, name = self.encoder_for(i), f"input {i}"
                if isinstance(v, Chunks):  # FullBatch's ready-made chunks: none holds pixels it owns nothing of
                    v = Chunks([own_images(c, f"chunk {k + 1} of {name}", self.vision_hints(i, c))
                                for k, c in enumerate(v)])
                if trim:
                    v = trim_padding(v, self.trims_leading(i, v))
                outputs = encode(encoder, v, self.get_embedding_for(i), name)
                if torch.is_grad_enabled():
                    check_output_learns(encoder, outputs, name)
                embeddings.extend(outputs)
        return [with_values(e, upcast) for e in embeddings]

    def loss_over(self, embeddings: list[Embedding], loss_kwargs: dict[str, Any], where: str = "") -> torch.Tensor:
        """The loss over every rank's embeddings (when gathering), in float32 with autocast off, checked."""
        if self.options["gather"]:
            embeddings = [all_gather_embedding(e) for e in embeddings]  # (N_i * world_size, D), rank order
        with autocast_off_everywhere():
            loss = self.checked_loss(self.loss_fn(*embeddings, **loss_kwargs), where)
        self.check_connected(loss, embeddings, where)
        return loss

    def check_connected(self, loss: torch.Tensor, embeddings: list[Embedding], where: str = "") -> None:
        """A loss over embeddings that carry gradients must carry one too: otherwise its backward fails with
        torch's bare "does not require grad", naming neither loss_fn nor the cause."""
        if torch.is_grad_enabled() and not loss.requires_grad and any(values_of(e).requires_grad for e in embeddings):
            raise ValueError(
                f"loss_fn returned a loss that does not depend on the embeddings at step {self.steps_taken + 1}"
                f"{where} (it does not require grad), so no gradient can reach the encoders. Check that loss_fn "
                "computes its result from its arguments, without .detach(), .item(), torch.no_grad() or a new "
                "torch.tensor(...) on the way."
            )

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return self.options["scaler"].scale(loss) if self.options["scaler"] is not None else loss


def check_output_learns(encoder: nn.Module, outputs: Sequence[Embedding], name: str) -> None:
    """ValueError naming the encoder of `name` when it has parameters that require grad but none of its `outputs`
    (encoded with gradients enabled) does: the output is detached from the parameters, and a step would leave
    their `.grad` None without a word. A frozen encoder (no parameter requiring grad) passes."""
    if any(values_of(e).requires_grad for e in outputs) or not any(p.requires_grad for p in encoder.parameters()):
        return
    raise ValueError(
        f"the encoder of {name} ({type(encoder).__name__}) has parameters that require grad, but its output does "
        "not require grad: it is detached from them (a .detach(), torch.no_grad() or inference_mode inside its "
        "forward, or a round trip through numpy), so no gradient would reach them. Return the output as computed "
        "from the parameters, or freeze the encoder with encoder.requires_grad_(False)."
    )


def _for_input(option: Any, index: int) -> Any:
    """A per-input option's entry for input `index`: the option itself when it is one callable (or None)."""
    return option if option is None or callable(option) else option[index]
