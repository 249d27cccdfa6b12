"""Any Hugging Face ``AutoModel`` as a text encoder: last hidden states pooled over the attention mask."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

HF_POOLINGS = ("mean", "cls")


def _load_local_model(path: str | os.PathLike) -> nn.Module:
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            'HuggingFaceEncoder needs the transformers package: pip install -e ".[hf]"'
        ) from error
    # local_files_only: this project never downloads; a hub name that is not on disk fails here.
    return transformers.AutoModel.from_pretrained(os.fspath(path), local_files_only=True)


class HuggingFaceEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L), ...) -> pooled last hidden state (B, out_dim).

    ``"mean"`` averages the hidden states of the tokens whose mask is 1 (sentence-transformers'
    mean pooling); ``"cls"`` takes position 0. Extra keyword arguments (``token_type_ids`` ...) go
    to the model unchanged.

    Args:
        path_or_model: a local directory saved by ``save_pretrained`` (loaded with
            ``AutoModel.from_pretrained(..., local_files_only=True)``) or an already-built model whose
            output has ``last_hidden_state`` or whose first output is the hidden states.
        pooling: ``"mean"`` or ``"cls"``.

    Raises:
        ImportError: a path was given and ``transformers`` is not installed.
        ValueError: unknown ``pooling``.
        TypeError: ``path_or_model`` is neither a path nor an ``nn.Module``.

    Example:
        >>> encoder = HuggingFaceEncoder("/data/tiny-bert", pooling="mean")  # written by save_pretrained
        >>> features = encoder(input_ids, attention_mask)  # (B, encoder.out_dim)
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in HF_POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not supported; choose one of {HF_POOLINGS}.")
        if isinstance(path_or_model, (str, os.PathLike)):
            model = _load_local_model(path_or_model)
        elif isinstance(path_or_model, nn.Module):
            model = path_or_model
        else:
            raise TypeError(
                f"path_or_model must be a local directory or an nn.Module, got {type(path_or_model).__name__}."
            )
        self.model = model
        self.pooling = pooling
        config = getattr(model, "config", None)
        self.out_dim = getattr(config, "hidden_size", None)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Use the model's own activation checkpointing (non-reentrant); active in training mode only."""
        model = self.model
        # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (old names deprecated).
        new_api = hasattr(model, "activation_checkpointing_enable")
        if not enabled:
            name = "activation_checkpointing_disable" if new_api else "gradient_checkpointing_disable"
            if hasattr(model, name):
                getattr(model, name)()
            return
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise TypeError(f"{type(model).__name__} does not support activation checkpointing.")
        options = {"use_reentrant": False}
        if new_api:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]  # (B, L, H)
        if self.pooling == "cls":
            return hidden[:, 0]  # (B, H)
        if attention_mask is None:
            return hidden.mean(dim=1)  # (B, H)
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
        # clamp: an all-padding row pools to zeros instead of 0 / 0.
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # (B, H)
