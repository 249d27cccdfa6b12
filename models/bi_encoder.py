"""A retrieval bi-encoder: queries and passages embedded by one shared (siamese) tower or by two towers."""

from __future__ import annotations

import torch
from torch import nn


class BiEncoder(nn.Module):
    """``encode_query(**tokens) -> (B, D)`` and ``encode_passage(**tokens) -> (B, D)``, unnormalised.

    One tower (``passage_tower`` None) embeds both sides, as sentence-transformers and DPR's shared variant do;
    two towers have their own parameters, as DPR's query and passage encoders do. The towers are held in
    ``towers``, each once, so a shared tower's parameters appear once in ``parameters()`` and ``state_dict()``;
    give ``towers`` (one module shared by every input, or one per input) to GradCache as its encoders.

    Args:
        query_tower: ``(input_ids=..., attention_mask=...)`` -> (B, D), e.g. ``HuggingFaceEncoder``.
        passage_tower: the same signature with the same D, or None to share ``query_tower``.

    Raises:
        ValueError: ``passage_tower`` is ``query_tower`` (pass None to share it).

    Example:
        >>> model = BiEncoder(HuggingFaceEncoder(path))                       # shared
        >>> model = BiEncoder(HuggingFaceEncoder(path), HuggingFaceEncoder(path))  # two towers, same start
        >>> query = model.encode_query(**tokenizer(["who bakes bread?"]))
    """

    def __init__(self, query_tower: nn.Module, passage_tower: nn.Module | None = None) -> None:
        super().__init__()
        if passage_tower is query_tower:
            raise ValueError("passage_tower is query_tower; pass passage_tower=None to share one tower.")
        self.towers = nn.ModuleList([query_tower] if passage_tower is None else [query_tower, passage_tower])
        self.out_dim = getattr(query_tower, "out_dim", None)

    @property
    def shared(self) -> bool:
        return len(self.towers) == 1

    @property
    def query_tower(self) -> nn.Module:
        return self.towers[0]

    @property
    def passage_tower(self) -> nn.Module:
        return self.towers[-1]

    def encode_query(self, **tokens: torch.Tensor) -> torch.Tensor:
        return self.query_tower(**tokens)

    def encode_passage(self, **tokens: torch.Tensor) -> torch.Tensor:
        return self.passage_tower(**tokens)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Each tower's own activation checkpointing (``HuggingFaceEncoder`` uses the model's)."""
        for tower in self.towers:
            tower.set_grad_checkpointing(enabled)
