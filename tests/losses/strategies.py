"""GradCache (and CachedLoss) against one full-batch pass on a tiny float64 encoder, for any InfoNCE setting."""

from __future__ import annotations

import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from tests.conftest import assert_grads_close, grads_of, mlp, zero


def batch(n: int, hard_negatives: int, seed: int = 0) -> list[torch.Tensor]:
    """Inputs of a 10-feature encoder: queries, positives near them, and N * h negatives (if h > 0)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(n, 10, generator=generator, dtype=torch.float64)
    positive = query + 0.5 * torch.randn(n, 10, generator=generator, dtype=torch.float64)
    inputs = [query, positive]
    if hard_negatives:
        inputs.append(torch.randn(n * hard_negatives, 10, generator=generator, dtype=torch.float64))
    return inputs


def strategy_grads(loss_fn: nn.Module, inputs: list[torch.Tensor], chunk_size: int = 3,
                   **loss_kwargs) -> dict[str, dict[str, torch.Tensor]]:
    """Every encoder and loss parameter's gradient after one step of each strategy, from the same weights."""
    torch.manual_seed(0)
    encoder = mlp(10, 16, 6, dropout=0.1).double()
    # Negatives split with their queries (chunk_size * h rows), so naive micro-batch k is queries k and theirs.
    per_query = [t.shape[0] // inputs[0].shape[0] for t in inputs]
    chunk_sizes = [chunk_size * rows for rows in per_query]
    results = {}
    strategies = {
        "full": lambda: FullBatch(encoder, loss_fn),
        "gradcache": lambda: GradCache(encoder, loss_fn, chunk_sizes),
        "cached_loss": lambda: CachedLoss(encoder, loss_fn, chunk_sizes),
        "naive": lambda: NaiveAccumulation(encoder, loss_fn, chunk_sizes),
    }
    for name, make in strategies.items():
        if name == "naive" and loss_kwargs:
            continue  # per-micro-batch guide rows would need slicing: naive is the negative control elsewhere
        zero(encoder, loss_fn)
        torch.manual_seed(1)  # the same dropout masks for every strategy's first encoding
        strategy = make()
        if name == "cached_loss":
            strategy(*inputs, **loss_kwargs).backward()
        else:
            strategy.step(*inputs, **loss_kwargs)
        results[name] = grads_of(encoder, loss_fn)
    return results


def assert_gradcache_equals_full_batch(loss_fn: nn.Module, inputs: list[torch.Tensor], **loss_kwargs) -> None:
    """GradCache and CachedLoss give the full-batch gradient of every parameter; naive accumulation does not."""
    results = strategy_grads(loss_fn, inputs, **loss_kwargs)
    assert_grads_close(results["gradcache"], results["full"], rel=1e-10)
    assert_grads_close(results["cached_loss"], results["full"], rel=1e-10)
    if "naive" in results:
        error = max((results["naive"][k] - results["full"][k]).abs().max().item() for k in results["full"])
        assert error > 1e-4, "naive accumulation matched the full batch: the check cannot tell them apart"
