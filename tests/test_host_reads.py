"""A GradCache step with the recompute check off reads the device from the host a fixed number of times, whatever the
number of chunks: dense vectors, a sparse cache (SPLADE's rows) and token embeddings with an integer mask, counted
at 2 and at 8 chunks of one batch. A host read is what makes the host wait for the device: `.item()`, `.tolist()`,
`.cpu()`, `bool`/`int`/`float` of a tensor, an output whose size depends on the values (`nonzero`, a boolean
mask as an index, `masked_select`, `unique`), and a tensor built from host data (`torch.tensor`: a host-to-device
copy on an accelerator)."""
from __future__ import annotations

import multiprocessing

from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import pytest
import torch
from torch import nn

from gradcache import GradCache, TokenEmbeddings
from gradcache.losses import InfoNCE, LateInteraction, SpladeLoss
from tests.conftest import TokenEncoder, tokens
from tests.test_sparse_cache import Splade, batch as splade_batch

BATCH = 16
READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}
VALUE_SIZED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "repeat_interleave"}
FROM_HOST = {"tensor", "as_tensor", "new_tensor"}


class HostReads:
    """Counts, by name, each torch call that waits for the device or copies host data onto it, in phase (3) too:
    torch's methods and functions are wrapped on their classes and module (a TorchFunctionMode does not reach the
    autograd engine, which runs phase (3))."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._patches: list = []

    def __enter__(self) -> HostReads:
        methods = READS | VALUE_SIZED | {"__getitem__", "__setitem__", "index_put", "index_put_", "new_tensor"}
        targets = [(torch.Tensor, name) for name in sorted(methods) if hasattr(torch.Tensor, name)]
        targets += [(torch, name) for name in sorted(VALUE_SIZED | FROM_HOST) if hasattr(torch, name)]
        for owner, name in targets:
            patch = mock.patch.object(owner, name, self._counting(getattr(owner, name), name))
            patch.start()
            self._patches.append(patch)
        return self

    def __exit__(self, *exc: object) -> None:
        for patch in reversed(self._patches):
            patch.stop()

    def _counting(self, original, name: str):
        def counted(*args, **kwargs):
            if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):
                if _bool_index(args[1]):
                    self.counts[f"{name} with a bool mask"] += 1
            elif name not in VALUE_SIZED or "output_size" not in kwargs:
                self.counts[name] += 1
            return original(*args, **kwargs)
        return counted


def _bool_index(index: object) -> bool:
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class IntegerMaskTokens(nn.Module):
    """Token vectors and, as scoring mask, the input's integer (0/1) attention mask, as a ColBERT often returns."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.project = nn.Linear(8, 6)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TokenEmbeddings:
        return TokenEmbeddings(torch.tanh(self.project(self.embed(input_ids))), attention_mask)


def dense_step(chunk_size: int) -> None:
    torch.manual_seed(0)
    GradCache(TokenEncoder(), InfoNCE(), chunk_size, check_recompute=False).step(
        tokens(BATCH, seed=1), tokens(BATCH, seed=2))


def sparse_step(chunk_size: int) -> None:
    torch.manual_seed(0)
    queries, positives, negatives = splade_batch(BATCH // 2)  # 8, 8 and 16 rows
    GradCache(Splade(shift=0.4, dropout=0.1), SpladeLoss(document_regularizer_weight=0.3), chunk_size,
              sparse_cache=True, check_recompute=False).step(queries, positives, negatives)


def token_step(chunk_size: int) -> None:
    torch.manual_seed(0)
    GradCache(IntegerMaskTokens(), LateInteraction(), chunk_size, check_recompute=False).step(
        tokens(BATCH, seed=1), tokens(BATCH, seed=2))


def counted_apart(step, *chunk_sizes: int) -> list[Counter[str]]:
    """`host_reads` at each chunk size, in a fresh process: wrapping `Tensor.__getitem__` on the class and taking
    the wrapper off again leaves CPython's sequence slot set on torch.Tensor, so every later `torch.tensor` of a
    list of 0-d tensors in the process fails ("len() of a 0-d tensor"; Qwen2-VL's rope index builds one)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [pool.submit(host_reads, step, chunk_size).result() for chunk_size in chunk_sizes]


def host_reads(step, chunk_size: int) -> Counter[str]:
    step(chunk_size)  # a first step outside the count: torch's own one-time initialisation
    with HostReads() as reads:
        step(chunk_size)
    return reads.counts


@pytest.mark.parametrize("step, two, eight, chunks, per_chunk", [
    (dense_step, BATCH // 2, BATCH // 8, (4, 16), {}),
    # the 8 queries in 2 or 8 chunks, positives alike, the 16 negatives in 4 or 16; each chunk's compaction reads
    # its count of non-zeros, the size of its buffer (gradcache/sparse_rows.py), and nothing else
    (sparse_step, BATCH // 4, BATCH // 16, (8, 32), {"nonzero": 1}),
    (token_step, BATCH // 2, BATCH // 8, (4, 16), {}),
], ids=["dense", "sparse", "tokens"])
def test_host_reads_do_not_grow_with_the_chunks(step, two, eight, chunks, per_chunk):
    few, many = counted_apart(step, two, eight)
    more = chunks[1] - chunks[0]
    grown = {name: many[name] - few[name] for name in few.keys() | many.keys() if many[name] != few[name]}
    assert grown == {name: n * more for name, n in per_chunk.items()}, \
        f"host reads at {chunks[0]} chunks {dict(few)}, at {chunks[1]} chunks {dict(many)}"
