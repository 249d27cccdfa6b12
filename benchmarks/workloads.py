"""What one benchmark step trains: the encoders, the loss, random inputs of a batch, and the strategies over them.

A workload is built the same way in every fresh process, from plain settings (a JSON point), so the parent
never holds a model. The four strategies share one signature, so each is one line in ``STRATEGIES``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import gradcache
from gradcache import FullBatch, GradCache, NaiveAccumulation, losses
from gradcache.models import CLIP, ProjectionHead, SimCLRModel, TextEncoder, build_image_encoder

LOSS_OF_TASK = {"simclr": "ntxent", "clip": "clip"}  # the loss each task trains with
TASKS = tuple(LOSS_OF_TASK)
VOCAB_SIZE = 259  # ByteTokenizer's vocabulary: pad, bos, eos and 256 bytes

# name -> (encoders, loss, chunk_size) -> strategy. The tiled variant differs only in the loss it is given.
STRATEGIES: dict[str, Callable[[Any, nn.Module, int], Any]] = {
    "full_batch": lambda encoders, loss, chunk: FullBatch(encoders, loss),
    "naive": lambda encoders, loss, chunk: NaiveAccumulation(encoders, loss, chunk),
    "gradcache": lambda encoders, loss, chunk: GradCache(encoders, loss, chunk),
    "gradcache_tiled": lambda encoders, loss, chunk: GradCache(encoders, loss, chunk),
}
LOSS_ONLY = "loss_only"  # the dense loss's forward and backward on random embeddings: the O(N^2) part alone


@dataclass
class Workload:
    """One task at one batch: ``encoders`` as a strategy takes them, the ``inputs`` tuple, and the loss."""

    task: str
    encoders: list[nn.Module]
    inputs: tuple[Any, ...]
    loss: nn.Module
    embed_dim: int
    device: torch.device

    @property
    def strategy_encoders(self) -> nn.Module | list[nn.Module]:
        """A single module when both inputs share it (SimCLR's two views), else one per input."""
        return self.encoders[0] if len(self.encoders) == 1 else self.encoders

    def parameters(self) -> list[nn.Parameter]:
        params = [p for encoder in self.encoders for p in encoder.parameters()]
        return params + list(self.loss.parameters())

    def zero_grad(self) -> None:
        for param in self.parameters():
            param.grad = None

    def loss_only_backward(self) -> None:
        """The loss's forward and backward on random (N, D) embeddings, with no encoder: its own memory and time."""
        first = self.inputs[0]
        rows = len(first["input_ids"]) if isinstance(first, dict) else len(first)
        embeddings = [torch.randn(rows, self.embed_dim, device=self.device, requires_grad=True) for _ in self.inputs]
        self.loss(*embeddings).backward()

    def encode_without_grad(self, chunk_size: int) -> None:
        """One chunked no-grad forward over every input: the extra work GradCache's phase (1) adds."""
        with torch.no_grad():
            for index, value in enumerate(self.inputs):
                encoder = self.encoders[min(index, len(self.encoders) - 1)]
                if isinstance(value, dict):
                    pieces = zip(*(tensor.split(chunk_size) for tensor in value.values()))
                    for piece in pieces:
                        encoder(**dict(zip(value.keys(), piece)))
                else:
                    for piece in value.split(chunk_size):
                        encoder(piece)


def negatives_per_anchor(task: str, strategy: str, batch: int, chunk: int) -> int:
    """`gradcache.negatives_per_anchor` for a benchmark point: its strategies are the library's but for the
    tiled variant, the interleaved timing and the loss alone, which see the whole batch."""
    library_name = strategy if strategy in ("naive", "gradcache") else "full"
    return gradcache.negatives_per_anchor(library_name, LOSS_OF_TASK[task], batch, chunk)


def build_workload(settings: dict[str, Any], device: torch.device) -> Workload:
    """Settings of a point (task, model, image_size, batch, tile_size, text_length, seed) -> a Workload."""
    task, batch, size = settings["task"], settings["batch"], settings["image_size"]
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a benchmark task; choose one of {TASKS}.")
    torch.manual_seed(settings.get("seed", 0))
    tile_size = settings["tile_size"] if settings["strategy"] == "gradcache_tiled" else None
    backbone = build_image_encoder(settings["model"])
    if task == "simclr":
        model = SimCLRModel(backbone, ProjectionHead(backbone.out_dim)).to(device)
        views = tuple(torch.randn(batch, 3, size, size, device=device) for _ in range(2))
        return Workload(task, [model], views, losses.NTXent(tile_size=tile_size), model.out_dim, device)
    length = settings["text_length"]
    text = TextEncoder(VOCAB_SIZE, context_length=length)
    model = CLIP(backbone, text).to(device)
    images = torch.randn(batch, 3, size, size, device=device)
    tokens = {"input_ids": torch.randint(3, VOCAB_SIZE, (batch, length), device=device),
              "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device)}
    loss = losses.ClipLoss(tile_size=tile_size).to(device)
    return Workload(task, [model.image_tower, model.text_tower], (images, tokens), loss, model.image_tower.out_dim,
                    device)


def input_bytes(workload: Workload) -> int:
    """Bytes held by the batch's input tensors (the part of memory every strategy must pay for)."""
    total = 0
    for value in workload.inputs:
        for tensor in value.values() if isinstance(value, dict) else [value]:
            total += tensor.numel() * tensor.element_size()
    return total
