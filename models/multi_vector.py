"""A Hugging Face encoder as a multi-vector (ColBERT) text encoder: every token's last hidden state projected to a
small width and L2-normalised, with the mask of the positions that are scored."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradcache.models.huggingface import HuggingFaceEncoder
from gradcache.token_embeddings import TokenEmbeddings

DEFAULT_TOKEN_DIM = 128  # sentence-transformers' MultiVectorEncoder projects a bare transformer to 128


class MultiVectorTextEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L), ...) -> TokenEmbeddings(normalize(H W^T) (B, L, D), mask (B, L)).

    H is the model's last hidden state (B, L, hidden), W the (D, hidden) projection without bias (``projection``,
    sentence-transformers' token-level ``Dense(hidden, D, bias=False)``), each token's vector divided by its L2
    norm (``Normalize``). The mask is the scoring mask sentence-transformers' ``MultiVectorMask`` gives by default:
    the attention mask, or'ed with ``query_expansion_positions`` where given (ColBERT's query expansion: positions
    scored though not attended), so ``MultiVectorEncoder.encode`` of the exported folder returns exactly
    ``values[mask]`` per text. Padding columns trimmed from a batch change nothing (the attention ignores them and
    the mask drops them).

    The model is loaded as ``HuggingFaceEncoder`` loads it (a local Hugging Face or sentence-transformers folder,
    never downloaded; its pooler, never read, removed so every parameter gets a gradient); the projection starts
    at random (``nn.Linear``'s initialisation), as a fresh ``MultiVectorEncoder``'s does.

    Args:
        path_or_model: a local model folder, or a built model whose output has ``last_hidden_state``.
        token_dim: D, the width of each token vector (default 128).

    Raises:
        ValueError: ``token_dim`` below 1; a folder that does not load (as ``HuggingFaceEncoder``).
        TypeError: ``token_dim`` not an int.

    Example:
        >>> encoder = MultiVectorTextEncoder("/data/tiny-bert", token_dim=128)
        >>> tokens = encoder(**tokenizer(["who bakes bread?"]))  # TokenEmbeddings (1, L, 128), (1, L)
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, token_dim: int = DEFAULT_TOKEN_DIM) -> None:
        super().__init__()
        if isinstance(token_dim, bool) or not isinstance(token_dim, int):
            raise TypeError(f"token_dim must be an int (the width of each token vector), got {token_dim!r}")
        if token_dim < 1:
            raise ValueError(f"token_dim={token_dim} must be at least 1; ColBERT projects to 128")
        loaded = HuggingFaceEncoder(path_or_model)  # the folder's checks, its pooler dropped
        self.model = loaded.model
        self.max_seq_length = loaded.max_seq_length
        self.hidden_size = loaded.out_dim
        self.projection = nn.Linear(loaded.out_dim, token_dim, bias=False)
        self.out_dim = token_dim
        self.train()

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """The model's own activation checkpointing, as ``HuggingFaceEncoder``'s."""
        HuggingFaceEncoder.set_grad_checkpointing(self, enabled)  # type: ignore[arg-type]  # reads .model alone

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                query_expansion_positions: torch.Tensor | None = None, prompt_length: torch.Tensor | None = None,
                **kwargs: Any) -> TokenEmbeddings:
        """Token embeddings and their scoring mask (class docstring); `prompt_length` (a tokenizer's, for pooling)
        is not read: a prompt's tokens are scored like any other."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]  # (B, L, H)
        values = F.normalize(self.projection(hidden), dim=-1)  # (B, L, D)
        mask = attention_mask.ne(0)  # (B, L)
        if query_expansion_positions is not None:
            mask = mask | query_expansion_positions.ne(0)
        return TokenEmbeddings(values, mask)
