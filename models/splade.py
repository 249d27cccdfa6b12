"""A Hugging Face masked-language model as a SPLADE encoder: one nonnegative vocabulary-sized row per text.

    w_j = max_t a(m_t logit_tj),  a(x) = log(1 + relu(x))          (B, L, V) MLM logits -> (B, V) rows

with m_t the attention mask (padding contributes a(0) = 0, which no row's max lies below). This is
sentence-transformers' `SparseEncoder` on a `*ForMaskedLM` folder: its fill-mask `Transformer` and
`SpladePooling("max", "relu")`, so a folder written from this model encodes identically there. A folder's
`SpladePooling` may say otherwise, and is followed: `pooling_strategy` "sum" (SPLADE v1) is sum_t instead of
max_t, and `activation_function` "log1p_relu" (OpenSearch's) is a(x) = log(1 + log(1 + relu(x))). A row is 0
exactly where the relu clamps every token's logit, which is what makes the library's `sparse_cache` exact for it
(gradcache/sparse_rows.py).
"""
from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache.models.huggingface import check_weights
from gradcache.models.sentence_transformers_folder import (
    SPLADE_ACTIVATIONS,
    SPLADE_POOLING_STRATEGIES,
    read_sentence_transformer_folder,
)


def splade_rows(logits: torch.Tensor, attention_mask: torch.Tensor, pooling_strategy: str = "max",
                activation_function: str = "relu") -> torch.Tensor:
    """(B, L, V) MLM logits and (B, L) mask -> (B, V) rows max_t (or sum_t) a(m_t logit_tj), as SpladePooling
    (module docstring)."""
    masked = logits * attention_mask.unsqueeze(-1).to(logits.dtype)  # (B, L, V), padding 0
    activated = torch.log1p(torch.relu(masked))  # (B, L, V)
    if activation_function == "log1p_relu":
        activated = torch.log1p(activated)
    return activated.amax(dim=1) if pooling_strategy == "max" else activated.sum(dim=1)  # (B, V)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' load report (the MLM head's weights it initialises) and progress bars off for one load:
    a folder without a head is a normal start here (docs/kinds.md says so), not an error to warn about."""
    import transformers

    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(verbosity)


def _load_masked_lm(path: str | os.PathLike) -> tuple[nn.Module, tuple[str, str]]:
    """The folder's masked-LM and its SpladePooling's (pooling_strategy, activation_function)."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError('SpladeEncoder needs the transformers package: pip install -e ".[hf]"') from error
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"path_or_model={str(folder)!r} is not a directory; give a local folder written by "
                                "save_pretrained (this project never downloads from a hub)")
    layout = read_sentence_transformer_folder(folder)
    pooling = (SPLADE_POOLING_STRATEGIES[0], SPLADE_ACTIVATIONS[0])
    if layout is not None:
        folder, pooling = layout.model_path, (layout.splade_pooling, layout.splade_activation)
    if not (folder / "config.json").is_file():
        raise ValueError(f"path_or_model={str(folder)!r} has no config.json, so it is not a Hugging Face model "
                         "folder; give the folder that save_pretrained wrote")
    check_weights(folder)
    try:
        with _quiet_loading():
            return transformers.AutoModelForMaskedLM.from_pretrained(os.fspath(folder), local_files_only=True), pooling
    except pickle.UnpicklingError as error:
        raise ValueError(f"the weights of {folder} (pytorch_model.bin) hold more than tensors, which could run "
                         "code, so they are not loaded; save the model as model.safetensors") from error
    except (OSError, RuntimeError, EOFError, KeyError) as error:
        raise ValueError(f"the model in {folder} does not load as a masked-language model: {error}".splitlines()[0]
                         ) from error
    except ValueError as error:  # a config with no *ForMaskedLM class (a decoder-only model)
        raise ValueError(f"the model in {folder} has no masked-language-model head class "
                         f"(AutoModelForMaskedLM): {str(error).splitlines()[0]}") from error


class SpladeEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L), ...) -> (B, V) SPLADE rows max_t log(1 + relu(MLM logits)).

    Paper: Formal et al. 2021, SPLADE v2 (max pooling), https://arxiv.org/abs/2109.10086.

    The model is `AutoModelForMaskedLM` of a local folder (a sentence-transformers folder's `Transformer` path
    where it has `modules.json`). A folder saved without the MLM head (a `BertModel`, all-MiniLM-L6-v2) gets the
    head transformers builds for it: its decoder tied to the word embeddings, the transform and bias initialised
    as transformers initialises them (from torch's global generator), without a warning. `prompt_length` and
    other keys a tokenizer adds are ignored; `token_type_ids` goes to the model.

    Args:
        path_or_model: a local directory, or a built masked-LM module whose output has `.logits`.
        pooling_strategy, activation_function: SpladePooling's (module docstring); None: a folder's
            `SpladePooling` config's, else "max" and "relu".

    Raises:
        ImportError: transformers is not installed.
        FileNotFoundError: a path that is not a directory.
        ValueError: a folder without config.json, with weights that do not fit it, or no MLM head class; a
            pooling_strategy or activation_function that SpladePooling refuses (a folder's names its file).
        TypeError: neither a path nor an nn.Module.

    Example:
        >>> encoder = SpladeEncoder("/data/tiny-bert")
        >>> rows = encoder(**tokenizer(["who bakes bread?"]))  # (1, encoder.out_dim), >= 0, mostly 0
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, pooling_strategy: str | None = None,
                 activation_function: str | None = None) -> None:
        super().__init__()
        for name, value, choices in (("pooling_strategy", pooling_strategy, SPLADE_POOLING_STRATEGIES),
                                     ("activation_function", activation_function, SPLADE_ACTIVATIONS)):
            if value is not None and value not in choices:
                raise ValueError(f"{name}={value!r} is not one of {choices}, SpladePooling's choices")
        own = (SPLADE_POOLING_STRATEGIES[0], SPLADE_ACTIVATIONS[0])
        if isinstance(path_or_model, (str, os.PathLike)):
            model, own = _load_masked_lm(path_or_model)
        elif isinstance(path_or_model, nn.Module):
            model = path_or_model
        else:
            raise TypeError(f"path_or_model must be a local directory or an nn.Module, got "
                            f"{type(path_or_model).__name__}")
        self.model = model
        self.pooling_strategy = own[0] if pooling_strategy is None else pooling_strategy
        self.activation_function = own[1] if activation_function is None else activation_function
        self.out_dim = getattr(getattr(model, "config", None), "vocab_size", None)
        self.train()  # the wrapper's mode is the model's from here on (from_pretrained returns eval mode)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """The model's own activation checkpointing (non-reentrant); active in training mode only."""
        model = self.model
        # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (old names deprecated).
        prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
        if not enabled:
            getattr(model, f"{prefix}_checkpointing_disable")()
            return
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise TypeError(f"{type(model).__name__} does not support activation checkpointing.")
        getattr(model, f"{prefix}_checkpointing_enable")(**{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **ignored: Any) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)  # (B, L)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits  # (B, L, V)
        return splade_rows(logits, attention_mask, self.pooling_strategy, self.activation_function)
