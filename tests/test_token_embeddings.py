"""Token embeddings through the core: a tiny ColBERT (BERT + projection, query expansion) under GradCache equals one
full-batch pass on every parameter, with trimming, token chunks, kept graphs and dropout; bad masks are refused
before any .grad is written; the recompute check compares the scored positions; two gloo ranks equal one process."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, RecomputationMismatchError, TokenEmbeddings
from gradcache.inputs import trim_padding
from gradcache.losses import LateInteraction
from tests.conftest import assert_grads_close, grads_of, zero

MASK_ID = 4  # [MASK]: ColBERT pads its queries with it (query expansion)
CHUNKS = (3, 3, 5)  # queries, positives, hard negatives (h = 2)


class TinyColbert(nn.Module):
    """BERT (1 layer, width 16) and a projection to unit token vectors; the scoring mask is the attention mask plus
    the query-expansion positions, which the attention does not see but MaxSim scores."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
        config = transformers.BertConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
            attn_implementation="eager",
        )
        self.bert = transformers.BertModel(config, add_pooling_layer=False)
        self.project = nn.Linear(16, 8)
        self.lengths: list[int] = []

    def forward(self, input_ids, attention_mask, query_expansion_positions=None) -> TokenEmbeddings:
        self.lengths.append(input_ids.shape[1])
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, 16)
        mask = attention_mask.bool()
        if query_expansion_positions is not None:
            mask = mask | query_expansion_positions.bool()
        return TokenEmbeddings(F.normalize(self.project(hidden), dim=-1), mask)


def texts(n: int, length: int, seed: int, expand: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded token ids of random lengths; queries (`expand`) padded with [MASK] as expansion positions."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (n, length), generator=g)
    real = torch.arange(length)[None, :] < torch.randint(1, length + 1, (n,), generator=g)[:, None]
    if expand:
        return {"input_ids": torch.where(real, ids, MASK_ID), "attention_mask": real.long(),
                "query_expansion_positions": (~real).long()}
    return {"input_ids": ids * real, "attention_mask": real.long()}


def batch(n: int = 7, seed: int = 1):
    return texts(n, 8, seed, expand=True), texts(n, 12, seed + 1), texts(2 * n, 10, seed + 2)


def model(dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    encoder = TinyColbert(dropout).double()
    loss = LateInteraction(temperature=0.5, tile_size=4, column_tile_size=11)  # blocks straddle positives and negatives
    return (encoder.train() if dropout else encoder.eval()), loss


def test_trimming_keeps_the_expansion_positions():
    query = texts(4, 8, 0, expand=True)
    assert trim_padding(query)["input_ids"].shape[1] == 8  # every column is scored, none is padding
    query["query_expansion_positions"].zero_()
    assert trim_padding(query)["input_ids"].shape[1] < 8  # the attention mask alone would cut them


@pytest.mark.parametrize("options", [
    {"trim_padding": True},
    {"chunk_tokens": [None, 20, 20]},
    {"chunk_tokens": [16, 20, None], "trim_padding": True, "memory_budget": 10**12},
    {"trim_padding": True, "memory_budget": "part"},
    {"cached": True, "trim_padding": True},
], ids=["trim", "tokens", "tokens-kept", "budget-part", "cached"])
def test_gradcache_equals_full_batch_on_every_parameter(options):
    encoder, loss = model()
    inputs = batch()
    want_loss = FullBatch(encoder, loss).step(*inputs)  # untrimmed, in one pass
    want = grads_of(encoder)
    zero(encoder)
    options = dict(options)
    if options.get("memory_budget") == "part":
        options["memory_budget"] = _graph_bytes(encoder, inputs[0]) * 2  # about the first chunk of queries
    encoder.lengths.clear()
    if options.pop("cached", False):
        got_loss = CachedLoss(encoder, loss, CHUNKS, **options)(*inputs)
        got_loss.backward()
    else:
        got_loss = GradCache(encoder, loss, CHUNKS, **options).step(*inputs)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-10)
    assert len(set(encoder.lengths)) > 1  # the chunks had lengths of their own: joined padded, cut back


def _graph_bytes(encoder: nn.Module, chunk: dict) -> int:
    from gradcache.graph_memory import saved_bytes
    from gradcache.inputs import tensors_of

    small = {k: v[:CHUNKS[0]] for k, v in chunk.items()}
    with saved_bytes([*encoder.parameters(), *tensors_of(small)]) as graph:
        encoder(**small)
    return graph.total


def chunked_reference(encoder, loss, inputs, chunk_sizes):
    """Dropout's reference, written here: each input's chunks in order, trimmed, encoded WITH a graph, joined
    padded by hand; the loss; one backward."""
    arguments = []
    for value, size in zip(inputs, chunk_sizes):
        pieces = []
        for start in range(0, value["input_ids"].shape[0], size):
            chunk = {k: v[start:start + size] for k, v in value.items()}
            kept = chunk["attention_mask"].bool() | chunk.get("query_expansion_positions", torch.zeros(1)).bool()
            length = int(kept.any(dim=0).nonzero().max()) + 1
            pieces.append(encoder(**{k: v[:, :length] for k, v in chunk.items()}))
        longest = max(p.values.shape[1] for p in pieces)
        values = torch.cat([F.pad(p.values, (0, 0, 0, longest - p.values.shape[1])) for p in pieces])
        mask = torch.cat([F.pad(p.mask, (0, longest - p.mask.shape[1])) for p in pieces])
        arguments.append(TokenEmbeddings(values, mask))
    value = loss(*arguments)
    value.backward()
    return value.detach()


def test_dropout_replayed_with_trimmed_chunks_of_different_lengths():
    encoder, loss = model(dropout=0.2)
    inputs = batch()
    torch.manual_seed(5)
    want_loss = chunked_reference(encoder, loss, inputs, CHUNKS)
    want = grads_of(encoder)
    zero(encoder)
    torch.manual_seed(5)
    got_loss = GradCache(encoder, loss, CHUNKS, trim_padding=True).step(*inputs)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-10)
    zero(encoder)
    torch.manual_seed(6)  # the control: other dropout masks give another gradient
    chunked_reference(encoder, loss, inputs, CHUNKS)
    assert any((grads_of(encoder)[k] - want[k]).abs().max() > 1e-6 for k in want)


def test_dropout_with_token_chunks_equals_its_kept_graphs():
    """Re-encoded sorted chunks (replayed masks) against the same chunks' graphs kept from their one forward."""
    results = []
    for budget in (None, 10**12):
        encoder, loss = model(dropout=0.2)
        torch.manual_seed(7)
        value = GradCache(encoder, loss, CHUNKS, chunk_tokens=[16, 20, 20], memory_budget=budget).step(*batch())
        results.append((value, grads_of(encoder)))
    assert torch.allclose(results[0][0], results[1][0], rtol=1e-12)
    assert_grads_close(results[0][1], results[1][1], 1e-10)


class Returns(nn.Module):
    """Token embeddings of fixed values with the mask `make_mask(calls, rows, length)` gives."""

    def __init__(self, make_mask) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, dtype=torch.float64))
        self.make_mask, self.calls = make_mask, 0

    def forward(self, x):
        self.calls += 1
        values = x[:, :, None] * self.weight  # (B, L, 3)
        return TokenEmbeddings(values, self.make_mask(self.calls, *x.shape))


@pytest.mark.parametrize("make_mask, error, match", [
    (lambda c, b, l: torch.ones(b, l + 1, dtype=torch.bool), ValueError, r"input 0.*mask has shape \(\d, 5\)"),
    (lambda c, b, l: torch.ones(b, l), TypeError, "input 0.*mask has dtype torch.float32"),
    (lambda c, b, l: torch.full((b, l), 2), ValueError, r"input 0.*mask holds \[2\]"),
    (lambda c, b, l: torch.ones(b, l, dtype=torch.bool) if c == 1 else torch.ones(b, l + 1, dtype=torch.bool),
     ValueError, "input 0.*mask has shape"),
])
def test_bad_masks_are_refused_before_any_grad(make_mask, error, match):
    encoder = Returns(make_mask)
    loss = LateInteraction()
    with pytest.raises(error, match=match):
        GradCache(encoder, loss, 2).step(torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64))
    assert encoder.weight.grad is None


def test_an_integer_mask_of_zeros_and_ones_is_a_bool_constant():
    seen = []
    encoder = Returns(lambda c, b, l: torch.ones(b, l, dtype=torch.long))
    GradCache(encoder, lambda q, p: seen.append(q.mask.dtype) or LateInteraction()(q, p), 2).step(
        torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64))
    assert seen == [torch.bool] and encoder.weight.grad is not None


def test_chunks_mixing_vectors_and_token_embeddings_are_refused():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.calls = nn.Parameter(torch.ones(1)), 0

        def forward(self, x):
            self.calls += 1
            return TokenEmbeddings(x[:, :, None] * self.weight, torch.ones(x.shape, dtype=torch.bool)) \
                if self.calls == 1 else (x * self.weight)

    encoder = Mixed()
    with pytest.raises(TypeError, match="input 0 returned token embeddings for its first chunk and a tensor"):
        GradCache(encoder, LateInteraction(), 2).step(torch.randn(4, 4), torch.randn(4, 4))
    assert encoder.weight.grad is None


def test_recompute_check_compares_masks_and_the_scored_values_only():
    # Phase (3) writes noise where the mask drops a position: not a mismatch, and the gradient is unchanged.
    class Noisy(Returns):
        def forward(self, x):
            out = super().forward(x)
            noise = torch.randn(out.values.shape, dtype=out.values.dtype, generator=self.generator)
            return TokenEmbeddings(torch.where(out.mask[..., None], out.values, noise), out.mask)

    inputs = (torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    lower = lambda c, b, l: torch.arange(l)[None, :] < torch.arange(1, b + 1)[:, None] % l + 1  # noqa: E731
    grads = []
    for encoder_class in (Returns, Noisy):
        torch.manual_seed(0)
        encoder = encoder_class(lower)
        encoder.generator = torch.Generator().manual_seed(1)  # not replayed: each pass draws other noise
        GradCache(encoder, LateInteraction(tile_size=2), 2).step(*inputs)
        grads.append(encoder.weight.grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12)

    flipping = Returns(lambda c, b, l: (torch.arange(l)[None, :] < (1 if c <= 6 else 2)).expand(b, l))
    with pytest.raises(RecomputationMismatchError, match="mask"):
        GradCache(flipping, LateInteraction(), 2).step(*inputs)
    assert flipping.weight.grad is None


# --- two gloo ranks ---------------------------------------------------------------------------------------------
def _ddp_worker(rank, world_size, slices):
    from torch.nn.parallel import DistributedDataParallel

    results = {}
    for name in ("gradcache", "cached", "full"):
        encoder, loss = model()
        wrapped = DistributedDataParallel(encoder)
        local = [{k: v[s] for k, v in value.items()} for value, s in zip(batch(), slices[rank])]
        if name == "cached":
            value = CachedLoss(wrapped, loss, CHUNKS, trim_padding=True, chunk_tokens=[None, 20, None])(*local)
            value.backward()
        elif name == "gradcache":
            value = GradCache(wrapped, loss, CHUNKS, trim_padding=True).step(*local)
        else:
            value = FullBatch(wrapped, loss, trim_padding=True).step(*local)
        results[name] = (value.detach(), grads_of(encoder))
    return results


@pytest.mark.slow
def test_two_ranks_equal_one_process():
    """Rank 0 holds 4 rows of each input, rank 1 the other 3 (8 and 6 hard negatives): each pads its documents to
    its own longest, the gather to the global longest."""
    from gradcache.token_chunks import padded_lengths
    from tests.multiprocess import run_on_ranks

    slices = [(slice(0, 4), slice(0, 4), slice(0, 8)), (slice(4, 7), slice(4, 7), slice(8, 14))]
    for index in (1, 2):  # each rank's documents have a longest row of their own
        lengths = padded_lengths(batch()[index]["attention_mask"])
        assert int(lengths[slices[0][index]].max()) != int(lengths[slices[1][index]].max())
    encoder, loss = model()
    want_loss = FullBatch(encoder, loss).step(*batch())
    want = grads_of(encoder)
    for rank_results in run_on_ranks(_ddp_worker, 2, slices):
        for name, (value, got) in rank_results.items():
            assert torch.allclose(value, want_loss, rtol=1e-12), name
            assert_grads_close(got, want, 1e-10)


def _fsdp_worker(rank, world_size, slices):
    from torch.distributed.fsdp import fully_shard

    results = {}
    for name in ("gradcache", "full"):
        encoder, loss = model()
        for layer in encoder.bert.encoder.layer:
            fully_shard(layer)
        fully_shard(encoder)
        local = [{k: v[s] for k, v in value.items()} for value, s in zip(batch(8), slices[rank])]
        if name == "gradcache":
            value = GradCache(encoder, loss, (2, 2, 4), trim_padding=True, chunk_tokens=[None, 16, None]).step(*local)
        else:
            value = FullBatch(encoder, loss, trim_padding=True).step(*local)
        grads = {n: p.grad.full_tensor() for n, p in encoder.named_parameters()}
        results[name] = (value.detach(), {f"0.{n}": g for n, g in grads.items()})
    return results


@pytest.mark.slow
def test_two_ranks_with_fsdp2_equal_one_process():
    from tests.multiprocess import run_on_ranks

    slices = [(slice(0, 4), slice(0, 4), slice(0, 8)), (slice(4, 8), slice(4, 8), slice(8, 16))]
    encoder, loss = model()
    want_loss = FullBatch(encoder, loss).step(*batch(8))
    want = grads_of(encoder)
    for rank_results in run_on_ranks(_fsdp_worker, 2, slices):
        for name, (value, got) in rank_results.items():
            assert torch.allclose(value, want_loss, rtol=1e-12), name
            assert_grads_close(got, want, 1e-10)


def test_naive_accumulation_takes_token_embeddings_and_is_not_the_full_batch():
    """Each micro-batch's loss within the micro-batch (trimmed to its own longest): runs, and, as the baseline,
    gives another gradient than the full batch."""
    from gradcache import NaiveAccumulation

    encoder, loss = model()
    inputs = batch(6)
    FullBatch(encoder, loss).step(*inputs)
    want = grads_of(encoder)
    zero(encoder)
    NaiveAccumulation(encoder, loss, (3, 3, 6), trim_padding=True).step(*inputs)
    got = grads_of(encoder)
    assert all(g is not None for g in got.values())
    assert any((got[k] - want[k]).abs().max() > 1e-6 for k in want)
