"""A small pre-norm Transformer text encoder, pooled over the tokens its attention mask keeps."""

from __future__ import annotations

import torch
from torch import nn

from gradcache.models.checkpointing import run_block
from gradcache.ranges import is_int

POOLINGS = ("mean", "cls", "eos")


class TextEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L)) -> pooled text features (B, out_dim), out_dim = width.

    Token plus learned absolute position embeddings, ``layers`` pre-norm ``nn.TransformerEncoderLayer``
    blocks with bidirectional attention, a final LayerNorm, then pooling:
    ``"mean"`` averages the kept tokens, ``"cls"`` takes position 0 (the tokenizer's ``bos``),
    ``"eos"`` takes the last kept token (padding is assumed on the right, as ``ByteTokenizer`` does).
    Padded positions (``attention_mask == 0``) are excluded from attention keys and from pooling,
    so dropping trailing all-padding columns does not change the output.

    Args:
        vocab_size: number of token ids (``ByteTokenizer.vocab_size`` is 259).
        context_length: the longest sequence accepted (size of the position table).
        width: token dimension; must be divisible by ``heads``.
        layers: number of Transformer blocks.
        heads: attention heads per block.
        pooling: ``"mean"``, ``"cls"`` or ``"eos"``.
        dropout: dropout inside the blocks (0 by default, as in CLIP).

    Raises:
        ValueError: bad sizes or unknown ``pooling`` here; in ``forward``, sequences longer than
            ``context_length`` or a mask whose shape differs from ``input_ids``.

    Example:
        >>> tokenizer = ByteTokenizer(context_length=64)
        >>> encoder = TextEncoder(tokenizer.vocab_size, context_length=64)
        >>> encoder(**tokenizer(["a photo of a cat", "a dog"])).shape
        torch.Size([2, 128])
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int = 64,
        width: int = 128,
        layers: int = 3,
        heads: int = 4,
        pooling: str = "mean",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("context_length", context_length),
                            ("width", width), ("layers", layers), ("heads", heads)):
            if not is_int(value, 1):
                raise ValueError(f"{name}={value!r} must be a positive int.")
        if width % heads:
            raise ValueError(f"width={width} is not divisible by heads={heads}.")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not supported; choose one of {POOLINGS}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r} must be in [0, 1).")
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Parameter(torch.empty(context_length, width))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding, std=0.01)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, dim_feedforward=4 * width, dropout=dropout,
                activation="gelu", batch_first=True, norm_first=True,
            )
            for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(width)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.pooling = pooling
        self.out_dim = width
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each Transformer block in backward instead of storing its activations."""
        self.grad_checkpointing = enabled

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled features; a row whose mask is all zeros has nothing to attend to and gives NaN."""
        length = input_ids.shape[1]
        if length > self.context_length:
            raise ValueError(
                f"input_ids has {length} tokens but context_length={self.context_length}; "
                f"tokenize with context_length<={self.context_length} or build a longer encoder."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        elif attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids shape "
                f"{tuple(input_ids.shape)}; pass the mask returned by the tokenizer with its ids."
            )
        keep = attention_mask.bool()  # (B, L)
        x = self.token_embedding(input_ids) + self.position_embedding[:length]  # (B, L, width)
        for layer in self.layers:
            # src_key_padding_mask is True where a key must be ignored.
            x = run_block(layer, x, src_key_padding_mask=~keep, checkpointed=self.grad_checkpointing)
        x = self.final_norm(x)
        if self.pooling == "cls":
            return x[:, 0]  # (B, width)
        if self.pooling == "eos":
            last = keep.long().sum(dim=1) - 1  # (B,) index of the last kept token
            return x[torch.arange(x.shape[0], device=x.device), last]  # (B, width)
        weights = keep.to(x.dtype).unsqueeze(-1)  # (B, L, 1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1)  # (B, width)
