"""The token tower the replay, memory and speed sections train, its batch, and its memory arithmetic.

A tower: embedding, one self-attention block (fused `scaled_dot_product_attention` with its own dropout, padding
keys masked), one MLP block with `nn.Dropout`, masked mean pooling, a projection. It ignores padded positions,
so token chunks (`chunk_tokens`) are exact; dropout is on in training mode, so phase (3) must replay each
chunk's masks on the device's generator.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.gpu.sizes import TowerSize

CUDA_OVERHEAD_BYTES = 64 * 2**20  # cuBLAS workspaces and the allocator's rounding, counted by max_memory_allocated


class TokenTower(nn.Module):
    """(input_ids (B, L), attention_mask (B, L)) -> (B, out)."""

    def __init__(self, size: TowerSize, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads, self.dropout = size.heads, dropout
        self.embed = nn.Embedding(size.vocab, size.width)
        self.qkv = nn.Linear(size.width, 3 * size.width)
        self.attention_out = nn.Linear(size.width, size.width)
        self.mlp = nn.Sequential(nn.Linear(size.width, 4 * size.width), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(4 * size.width, size.width))
        self.proj = nn.Linear(size.width, size.out)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)  # (B, L, W)
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L): padding keys masked
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keys,
                                                  dropout_p=self.dropout if self.training else 0.0)  # (B, H, L, W/H)
        x = x + self.attention_out(attended.transpose(1, 2).reshape(batch, length, width))
        x = x + self.mlp(x)
        mask = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
        return self.proj((x * mask).sum(1) / mask.sum(1).clamp_min(1))  # (B, out)


def tower_parameters(size: TowerSize) -> int:
    w = size.width
    return size.vocab * w + (3 * w * w + 3 * w) + (w * w + w) + (8 * w * w + 5 * w) + (w * size.out + size.out)


def activation_bytes_per_row(size: TowerSize) -> int:
    """Upper bound on the bytes one row's forward keeps for backward, and its backward's transients, in float32:
    per token 20 W saved values (16 W counted: x, q k v, the attention's output and its reshaped copy, the
    residual, 4 W GELU input, 4 W dropout output, the pooled input; 4 W allowed over), a 4 W byte dropout mask and
    10 W of transient gradients (the MLP's 4 W ones, alive at once when its backward starts); per row the (H, L, L)
    attention scores, probabilities and dropout mask where SDPA falls back to its math kernel. Against what
    `gradcache.graph_memory.saved_bytes` counts on the CPU's math kernel: about 1.6 x (tests/benchmarks/test_gpu.py)."""
    w, length = size.width, size.length
    return length * (4 * (20 * w + 10 * w) + 4 * w) + size.heads * length * length * 9


def loss_bytes(rows: int) -> int:
    """The (n, n) logits of a CLIP loss over `rows` pairs, its two softmaxes and their gradient, float32."""
    return 4 * 4 * rows * rows


def strategy_plan(size: TowerSize, strategy: str, budget: int = 0) -> int:
    """Planned peak bytes of one step of `strategy` over two towers of `size` (parameters built in the case).

    full_batch: every row's graph at once; naive: one chunk's; gradcache: one chunk's graph, the two (n, out)
    caches with their gradients, and the full batch's loss, plus `budget` bytes of kept graphs."""
    fixed = 2 * 2 * 4 * tower_parameters(size) + 2 * size.n * size.length * 16 + CUDA_OVERHEAD_BYTES  # weights, grads, ids
    per_row = activation_bytes_per_row(size)
    if strategy == "full_batch":
        return fixed + 2 * size.n * per_row + loss_bytes(size.n)
    if strategy == "naive":
        return fixed + 2 * size.chunk * per_row + loss_bytes(size.chunk)
    caches = 2 * 3 * 4 * size.n * size.out  # embeddings, their gradients and phase (3)'s re-encoded chunk
    return fixed + size.chunk * per_row + caches + loss_bytes(size.n) + budget


def step_flops(size: TowerSize, recompute: bool) -> float:
    """Forward and backward of both towers over the batch (x 4/3 where every chunk is encoded twice)."""
    tokens = 2 * size.n * size.length
    dense = 2 * 12 * size.width**2 * tokens + 4 * tokens * size.length * size.width  # linears, attention
    return 3 * dense * (4 / 3 if recompute else 1)


def make_towers(size: TowerSize, device: torch.device, seed: int = 0) -> tuple[TokenTower, TokenTower]:
    torch.manual_seed(seed)
    return TokenTower(size).to(device), TokenTower(size).to(device)


def make_batch(size: TowerSize, device: torch.device, seed: int = 0) -> tuple[dict[str, torch.Tensor], ...]:
    """Queries and passages of long-tailed lengths (most short, a tenth at `length`), right-padded."""
    g = torch.Generator().manual_seed(seed)
    sides = []
    for _ in range(2):
        lengths = torch.where(torch.rand(size.n, generator=g) < 0.1, size.length,
                              torch.randint(1, max(2, size.length // 4), (size.n,), generator=g))
        mask = (torch.arange(size.length)[None, :] < lengths[:, None]).long()  # (n, L)
        ids = torch.randint(1, size.vocab, (size.n, size.length), generator=g) * mask
        sides.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    return tuple(sides)


def gradients(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Every parameter's gradient (zeros where none), float32, in a fixed order."""
    return [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().clone()
            for m in modules for p in m.parameters() if p.requires_grad]


def max_rel_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """max |got - want| over every gradient, over max |want|."""
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want)) / scale
