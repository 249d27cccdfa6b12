"""A Hugging Face encoder as a multi-vector (ColBERT) text encoder: every token's last hidden state projected to a
small width and L2-normalised, with the mask of the positions that are scored."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradcache.models.huggingface import HuggingFaceEncoder, _load_local_model
from gradcache.models.multi_vector_folder import MultiVectorLayout, is_multi_vector_folder, read_multi_vector_folder
from gradcache.token_embeddings import TokenEmbeddings
from gradcache.ranges import is_int

DEFAULT_TOKEN_DIM = 128  # sentence-transformers' MultiVectorEncoder projects a bare transformer to 128
# The widest token vector built: ColBERT's are 128 wide, and a projection of 2e9 features (a mistyped option)
# would allocate hundreds of gigabytes before anything else fails.
MAX_TOKEN_DIM = 65536


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

    A sentence-transformers ``MultiVectorEncoder`` folder of the plain layout (``models/multi_vector_folder.py``:
    what ``--kind multi-vector`` exports) is loaded whole: its model and its trained projection.

    Args:
        path_or_model: a local model folder, or a built model whose output has ``last_hidden_state``.
        token_dim: D, the width of each token vector; None: a MultiVectorEncoder folder's own, else 128.

    Raises:
        ValueError: ``token_dim`` below 1 or above ``MAX_TOKEN_DIM``, or not the MultiVectorEncoder folder's; a
            folder that does not load (as ``HuggingFaceEncoder``, or a MultiVectorEncoder folder of another layout,
            or whose projection's ``in_features`` is not the model's hidden size): refused before the projection
            is built.
        TypeError: ``token_dim`` not an int.

    Example:
        >>> encoder = MultiVectorTextEncoder("/data/tiny-bert", token_dim=128)
        >>> tokens = encoder(**tokenizer(["who bakes bread?"]))  # TokenEmbeddings (1, L, 128), (1, L)
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, token_dim: int | None = None) -> None:
        super().__init__()
        if token_dim is not None and not is_int(token_dim):
            raise TypeError(f"token_dim must be an int (the width of each token vector), got {token_dim!r}")
        if token_dim is not None and not 1 <= token_dim <= MAX_TOKEN_DIM:
            raise ValueError(f"token_dim={token_dim} must be from 1 to {MAX_TOKEN_DIM}; ColBERT projects to 128")
        layout = None
        if isinstance(path_or_model, (str, os.PathLike)) and is_multi_vector_folder(path_or_model):
            layout = read_multi_vector_folder(path_or_model)
            if token_dim is not None and token_dim != layout.token_dim:
                raise ValueError(f"token_dim={token_dim}, but {path_or_model} projects to {layout.token_dim}; "
                                 "pass token_dim=None (or the folder's)")
            # the model alone: the folder's own modules.json describes the whole MultiVectorEncoder
            token_dim, path_or_model = layout.token_dim, _load_local_model(layout.model_path)
        token_dim = DEFAULT_TOKEN_DIM if token_dim is None else token_dim
        loaded = HuggingFaceEncoder(path_or_model)  # the folder's checks, its pooler dropped
        self.model = loaded.model
        self.max_seq_length = loaded.max_seq_length if layout is None else layout.max_seq_length
        self.hidden_size = loaded.out_dim
        if layout is not None and layout.hidden_size != loaded.out_dim:
            raise ValueError(f"{layout.dense_weights} projects {layout.hidden_size} features, but the model in "
                             f"{layout.model_path} has hidden size {loaded.out_dim}; the folder was edited or mixed: "
                             "export the model again")
        self.projection = nn.Linear(loaded.out_dim, token_dim, bias=False)
        if layout is not None:
            self.projection.load_state_dict({"weight": _projection_weight(layout, (token_dim, loaded.out_dim))})
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


def _projection_weight(layout: MultiVectorLayout, shape: tuple[int, int]) -> torch.Tensor:
    """The folder's trained projection, `linear.weight` of its Dense module, of `shape` (D, hidden) (ValueError)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weight = load_file(str(layout.dense_weights)).get("linear.weight")
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{layout.dense_weights} does not load: {error}") from error
    if weight is None or tuple(weight.shape) != shape:
        found = "no linear.weight" if weight is None else f"linear.weight of shape {tuple(weight.shape)}"
        raise ValueError(f"{layout.dense_weights} holds {found}; the projection is {shape} (token_dim, hidden)")
    return weight
