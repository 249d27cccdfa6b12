"""Section `tiled`: the tiled ClipLoss (logits never held whole) against the dense one at N = 16,384, gradients
of both embeddings compared; and one step of the tiled loss alone at N = 1,048,576, where the dense (N, N) logits
would take 4 TB."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.sizes import Sizes
from benchmarks.gpu.towers import CUDA_OVERHEAD_BYTES, loss_bytes, max_rel_error
from gradcache import losses

TOLERANCE = 1e-4  # float32: the tiles sum the same terms in another order


def embedding_bytes(n: int, dim: int) -> int:
    """Two (n, dim) float32 embeddings and their gradients."""
    return 4 * 4 * n * dim


def tile_bytes(tile: int) -> int:
    """A (tile, tile) block's logits, softmax and gradient, in each direction, float32."""
    return 2 * 3 * 4 * tile * tile


def step_flops(n: int, dim: int) -> float:
    """The forward's logits (2 N^2 D) and the backward, which recomputes them and multiplies twice more."""
    return 4 * 2 * n * n * dim


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    n, big, dim, tile = sizes.tiled_check, sizes.tiled_step, sizes.tiled_dim, sizes.tiled_tile
    check_plan = embedding_bytes(n, dim) + 4 * n * dim * 2 + loss_bytes(n) + tile_bytes(tile) + CUDA_OVERHEAD_BYTES
    step_plan = embedding_bytes(big, dim) + tile_bytes(tile) + 8 * 4 * big + CUDA_OVERHEAD_BYTES  # per-row sums
    large_gemms = 5e13 if device.type == "cuda" else 2e10  # the tiles are (8192, 512) x (512, 8192) products
    return [Case("tiled", f"tiled_vs_dense_n{n}", check_plan, estimated_seconds(2 * step_flops(n, dim), device),
                 _against_dense(n, dim, tile)),
            Case("tiled", f"tiled_step_n{big}", step_plan, step_flops(big, dim) / large_gemms + 1.0,
                 _one_step(big, dim, tile))]


def _embeddings(n: int, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(n, dim, device=device, generator=g).requires_grad_(),
            torch.randn(n, dim, device=device, generator=g).requires_grad_())


def _timed_backward(loss_fn: torch.nn.Module, image: torch.Tensor, text: torch.Tensor,
                    device: torch.device) -> tuple[list[torch.Tensor], float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    loss_fn(image, text).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    found = [image.grad, text.grad]
    image.grad = text.grad = None
    return found, time.perf_counter() - started


def _against_dense(n: int, dim: int, tile: int) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        image, text = _embeddings(n, dim, device)
        want, dense_s = _timed_backward(losses.ClipLoss(learnable=False).to(device), image, text, device)
        got, seconds = _timed_backward(losses.ClipLoss(learnable=False, tile_size=tile).to(device), image, text, device)
        error = max_rel_error(got, want)
        return {"step_s": seconds, "dense_step_s": dense_s, "max_rel_error": error, "tolerance": TOLERANCE,
                "failure": f"max_rel_error {error:.3g} > {TOLERANCE}" if error > TOLERANCE else None}
    return run


def _one_step(n: int, dim: int, tile: int) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        image, text = _embeddings(n, dim, device)
        found, seconds = _timed_backward(losses.ClipLoss(learnable=False, tile_size=tile).to(device), image, text,
                                         device)
        finite = all(bool(torch.isfinite(g).all()) for g in found)
        return {"step_s": seconds, "failure": None if finite else "a non-finite gradient"}
    return run
