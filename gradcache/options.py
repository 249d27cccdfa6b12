"""The keyword options of every strategy, spelled once: their names and types (`Options`, which `help()` and an
IDE show through `**options: Unpack[Options]`), their defaults (`DEFAULTS`) and their checks (`checked`; and
`check_memory_budget`, `check_chunk_tokens` alone, for a caller that names the option its own way, as
`gradcache train` names its flags)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TypedDict

import torch
from torch import nn

from gradcache.distributed import check_fsdp_reduce
from gradcache.inputs import GetEmbedding, SplitFn
from gradcache.autocast import HALF_DTYPES
from gradcache.ranges import is_int
from gradcache.reused_outputs import check_reuse_outputs

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover - Python 3.10
    from typing_extensions import Unpack

__all__ = ["DEFAULTS", "Options", "Unpack", "check_chunk_tokens", "check_memory_budget", "checked"]


class Options(TypedDict, total=False):
    """Keyword options of GradCache, CachedLoss, FullBatch and NaiveAccumulation (all optional).

    get_embedding: maps an encoder's output to its (B, D) embedding tensor or `TokenEmbeddings`, or to a tuple
        of several, each a loss argument of its own (default: the output itself); or one per input, with None
        where the output is the embedding (`[None, lambda out: out.pooler_output]`), as `split_fn`.
    split_fn: `split_fn(input, chunk_size) -> chunks`, called for every input when given (the one way to split a
        type the library does not know; for a tensor, mapping or sequence it replaces the split along dim 0), or
        one per input with None where the library splits (`[None, split_pairs]`). Not with `chunk_tokens` on the
        same input. FullBatch ignores it.
    trim_padding: drop trailing all-padding columns per chunk of a mapping (or pair) input with an `attention_mask`.
        Exact only for encoders that ignore masked positions, which cannot be checked: off by default.
    autocast_dtype: torch.bfloat16 or torch.float16 to run the encoders under autocast; the loss and the
        embedding gradients stay in float32.
    scaler: a `torch.amp.GradScaler`; `step` back-propagates `scaler.scale(loss)`, the caller runs
        `scaler.step(optimizer)` and `scaler.update()`. CachedLoss refuses one: its caller owns the backward.
    gather: under torch.distributed, compute the loss over the embeddings of every rank (the global batch,
        ordered by rank); False keeps each rank's loss local. Default True.
    fsdp_reduce: for encoders sharded with FSDP2's `fully_shard`, when gradients are reduce-scattered:
        "chunk" (default) after every chunk's backward, so gradients stay sharded (one reduce-scatter per
        chunk); "step" once per step, keeping unsharded gradients between chunks (one reduce-scatter, the
        memory of whole gradients). Plain and DDP encoders always synchronise once per step. Measured
        trade: benchmarks/results/sharding.md. Under FSDP2 every chunk's forward and backward is a
        collective, so every rank must split its inputs into as many chunks (checked, ValueError).
    memory_budget: bytes of autograd graphs that phase (1) may keep (GradCache, CachedLoss): chunks whose graphs
        fit are encoded once, with their graph, and back-propagated directly in phase (3); only the others are
        re-encoded. Counted as the bytes autograd saves for backward, each storage once, parameters and the
        inputs left out (see `gradcache.graph_memory`). None (default): keep none, every chunk re-encoded; a budget
        holding every chunk costs what accumulation at the same chunk size costs. Ignored by FullBatch and
        NaiveAccumulation, which keep every graph they build.
    chunk_tokens: for mapping inputs with a 2-D `attention_mask` (GradCache, CachedLoss): chunks of at most this
        many tokens, counted as rows x the chunk's own padded length, built over the examples sorted by
        length and trimmed to their longest row (one example longer than the budget is a chunk of its own);
        `chunk_size` still caps the rows. An int, or one per input with None where it does not apply (CLIP's
        images). Embeddings and gradients come back in the caller's order. Exact only for encoders that ignore
        masked positions, as `trim_padding`. FullBatch ignores it; NaiveAccumulation refuses it.
    check_recompute: phase (3) of GradCache and CachedLoss compares each re-encoded chunk's embedding with the
        one phase (1) cached, before its backward, and raises (RecomputationMismatchError, or
        NonFiniteRecomputationError for NaN/inf on recomputation alone) when they differ: True (default) with
        a tolerance for the precision the forward ran in (see `gradcache.recompute_check`), a float for that
        relative tolerance, False to turn it off for an encoder known to be nondeterministic. Costs one
        reduction and one host sync per re-encoded chunk. FullBatch and NaiveAccumulation recompute nothing.
    image_token_id, video_token_id: the id of the token a VLM's processor repeats for each image (video) position,
        for a batch whose rows' images are told by counting them (gradcache/vision_inputs.py) where neither the
        batch (`num_images_per_sample`, `mm_token_type_ids`) nor the encoder's config (`image_token_id`,
        `image_token_index`) says it. Default None.
    sparse_cache: GradCache and CachedLoss keep phase (1)'s (B, V) embeddings by their non-zeros and phase (2)'s
        gradient only there, so the cache costs memory in proportion to the non-zeros (SPLADE's rows). Exact
        for rows that are 0 only where a clamp at zero (relu, SPLADE's max-pooled log(1 + relu(.))) sends
        them; a negative value is refused (ValueError), see `gradcache.sparse_rows`. Not with `chunk_tokens`.
        Default False. FullBatch and NaiveAccumulation keep no cache and ignore it.
    reuse_outputs: submodules of the encoders that learn nothing (no parameter requiring grad: a frozen vision
        tower under LoRA on the language model), whose outputs phase (1) keeps, per chunk, and phase (3) returns
        instead of running them again (GradCache, CachedLoss; see `gradcache.reused_outputs`). Exact, dropout
        included. A listed module with a trainable parameter is refused (ValueError) before any `.grad` is
        written; a call whose inputs require grad, in phase (3). The kept outputs count in `memory_budget`: kept
        graphs first, then each re-encoded chunk's outputs while they fit, in chunk order (a chunk whose
        outputs do not fit runs the modules again in phase (3)); with no budget (None) every chunk's are kept.
        Default None. FullBatch and NaiveAccumulation run each forward once and ignore it.
    """

    get_embedding: GetEmbedding | None
    split_fn: SplitFn | Sequence[SplitFn | None] | None
    trim_padding: bool
    autocast_dtype: torch.dtype | None
    scaler: Any | None
    gather: bool
    fsdp_reduce: str
    memory_budget: int | None
    chunk_tokens: int | Sequence[int | None] | None
    check_recompute: bool | float
    sparse_cache: bool
    reuse_outputs: Sequence[nn.Module] | None
    image_token_id: int | None
    video_token_id: int | None


DEFAULTS: Options = {
    "get_embedding": None,
    "split_fn": None,
    "trim_padding": False,
    "autocast_dtype": None,
    "scaler": None,
    "gather": True,
    "fsdp_reduce": "chunk",
    "memory_budget": None,
    "chunk_tokens": None,
    "check_recompute": True,
    "sparse_cache": False,
    "reuse_outputs": None,
    "image_token_id": None,
    "video_token_id": None,
}


def checked(options: dict[str, Any]) -> Options:
    """Every option filled in (the defaults where not given) and checked, or a TypeError/ValueError that
    names the option, the value and the fix."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; the options are {sorted(DEFAULTS)}.")
    full: Options = {**DEFAULTS, **options}  # type: ignore[typeddict-item]
    _check_per_input_callable("get_embedding", full["get_embedding"], "the output itself")
    _check_per_input_callable("split_fn", full["split_fn"], "the library's own split")
    for name in ("trim_padding", "gather", "sparse_cache"):
        if not isinstance(full[name], bool):
            raise TypeError(f"{name} must be True or False, got {full[name]!r}.")
    dtype = full["autocast_dtype"]
    if dtype is not None and dtype not in HALF_DTYPES:
        raise ValueError(f"autocast_dtype must be torch.bfloat16, torch.float16 or None, got {dtype!r}.")
    scaler = full["scaler"]
    if scaler is not None and not (callable(getattr(scaler, "scale", None)) and hasattr(scaler, "update")):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {scaler!r}.")
    check_fsdp_reduce(full["fsdp_reduce"])
    check_memory_budget(full["memory_budget"])
    check_chunk_tokens(full["chunk_tokens"])
    _check_recompute(full["check_recompute"])
    check_reuse_outputs(full["reuse_outputs"])
    for name in ("image_token_id", "video_token_id"):
        if full[name] is not None:
            _check_count(name, full[name], 0, "a token id of the tokenizer, or None")
    if full["sparse_cache"] and full["chunk_tokens"] is not None:
        raise ValueError(
            f"sparse_cache=True is not available with chunk_tokens={full['chunk_tokens']!r}: the sparse cache keeps "
            "rows in chunk order. Drop chunk_tokens (use chunk_size, with trim_padding=True) or sparse_cache."
        )
    return full


def check_memory_budget(value: Any, name: str = "memory_budget") -> None:
    """Refuse a `memory_budget` that is neither None nor an int >= 0 (TypeError/ValueError); `name` is how the
    message names the option."""
    if value is None:
        return
    _check_int(name, value, "a number of bytes (0 keeps no graph), or None")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 bytes, got {value}: 0 keeps no graph of the first pass, a positive "
                         "budget keeps the chunks that fit, None keeps none.")


def check_chunk_tokens(value: Any, name: str = "chunk_tokens") -> None:
    """Refuse a `chunk_tokens` that is neither None, an int >= 1, nor a non-empty sequence of those (or None)
    (TypeError/ValueError); `name` is how the message names the option."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            raise ValueError(f"{name} is an empty sequence; give an int, or one int (or None) per input.")
        for i, entry in enumerate(value):
            if entry is not None:
                _check_count(f"{name}[{i}]", entry, 1, "tokens per chunk, or None for an input without one")
    elif value is not None:
        _check_count(name, value, 1, "tokens per chunk: rows x padded length")


def _check_per_input_callable(name: str, value: Any, none_means: str) -> None:
    """Refuse an option that is neither a callable, None, nor a non-empty sequence of callables (or None), one per
    input (TypeError/ValueError naming `name`); None stands for `none_means`."""
    if value is None or callable(value):
        return
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be callable, None, or one callable (or None) per input, got {value!r}.")
    if not value:
        raise ValueError(f"{name} is an empty sequence; give a callable, or one callable (or None) per input.")
    for i, entry in enumerate(value):
        if entry is not None and not callable(entry):
            raise TypeError(f"{name}[{i}] must be callable or None ({none_means}), got {entry!r}.")


def _check_recompute(value: Any) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, (int, float)):
        raise TypeError(f"check_recompute must be True, False or a relative tolerance (a float), got {value!r}.")
    if not 0 < value < float("inf"):
        raise ValueError(
            f"check_recompute must be a positive, finite relative tolerance (e.g. 0.1), got {value!r}; pass False "
            "to turn the check off."
        )


def _check_count(name: str, value: Any, least: int, meaning: str) -> None:
    _check_int(name, value, meaning)
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value} ({meaning}).")


def _check_int(name: str, value: Any, meaning: str) -> None:
    if not is_int(value):
        raise TypeError(f"{name} must be an int ({meaning}), got {value!r}.")
