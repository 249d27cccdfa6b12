"""LateInteraction against MaxSim InfoNCE written here as Python loops (float64, value and gradient), dense and every
tile shape; its refusals; and the tiled loss's memory: what it saves and allocates is flat in N."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradcache import NonFiniteEmbeddingError, TokenEmbeddings
from gradcache.losses import LateInteraction


def tokens(rows: int, length: int, dim: int = 4, seed: int = 0, dtype=torch.float64) -> TokenEmbeddings:
    """Random token vectors, each row masked after a random length >= 1; the masked positions hold noise too."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, length, dim, generator=g, dtype=dtype)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return TokenEmbeddings(values.requires_grad_(), mask)


def brute_force(query, positive, negatives, temperature: float, reduction: str) -> torch.Tensor:
    """-1/N sum_a log softmax_b(s(q_a, c_b) / t)[a], s = sum over the query's kept tokens of the max over the
    document's kept tokens of a dot product; c = positives then hard negatives. One dot product at a time."""
    documents = [(positive.values[b], positive.mask[b]) for b in range(len(positive.values))]
    if negatives is not None:
        documents += [(negatives.values[b], negatives.mask[b]) for b in range(len(negatives.values))]
    total = 0.0
    for a in range(len(query.values)):
        kept = [i for i in range(query.values.shape[1]) if query.mask[a, i]]
        logits = []
        for values, mask in documents:
            score = 0.0
            for i in kept:
                score = score + max((query.values[a, i] * values[j]).sum() for j in range(len(values)) if mask[j])
            logits.append((score / len(kept) if reduction == "mean" else score) / temperature)
        total = total - (logits[a] - torch.log(sum(torch.exp(logit) for logit in logits)))
    return total / len(query.values)


def gradients(loss, inputs):
    return torch.autograd.grad(loss, [t.values for t in inputs])


@pytest.mark.parametrize("n, hard_negatives, temperature, reduction", [
    (5, 0, 1.0, "sum"), (5, 2, 0.5, "sum"), (5, 2, 0.5, "mean"), (1, 1, 0.2, "mean"),
])
def test_equals_brute_force_dense_and_every_tile_shape(n, hard_negatives, temperature, reduction):
    query, positive = tokens(n, 5, seed=1), tokens(n, 7, seed=2)
    negatives = tokens(n * hard_negatives, 3, seed=3) if hard_negatives else None
    inputs = [t for t in (query, positive, negatives) if t is not None]
    want = brute_force(query, positive, negatives, temperature, reduction)
    want_grads = gradients(want, inputs)
    m = n * (1 + hard_negatives)
    shapes = [(None, None), (1, None), (2, None), (3, 2), (4, 1), (2, m), (n, m), (50, None)]
    for tile_size, column_tile_size in shapes:
        loss_fn = LateInteraction(temperature, query_reduction=reduction, tile_size=tile_size,
                                  column_tile_size=column_tile_size)
        got = loss_fn(*inputs)
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (tile_size, column_tile_size)
        for g, w in zip(gradients(got, inputs), want_grads):
            assert torch.allclose(g, w, rtol=1e-10, atol=1e-12), (tile_size, column_tile_size)


def test_masked_positions_get_no_gradient_and_change_nothing():
    query, positive, negatives = tokens(6, 5, seed=4), tokens(6, 7, seed=5), tokens(12, 4, seed=6)
    loss_fn = LateInteraction(0.5, tile_size=4, column_tile_size=5)
    value = loss_fn(query, positive, negatives)
    grads = gradients(value, [query, positive, negatives])
    for t, g in zip((query, positive, negatives), grads):
        assert g[~t.mask].abs().max() == 0
    with torch.no_grad():  # other values where the masks drop a position: the same loss
        for t in (query, positive, negatives):
            t.values[~t.mask] = 100.0
    assert torch.equal(loss_fn(query, positive, negatives), value)


def test_float32_inputs_give_a_float32_loss_close_to_float64():
    query, positive = tokens(6, 5, seed=7, dtype=torch.float32), tokens(6, 7, seed=8, dtype=torch.float32)
    wide = [TokenEmbeddings(t.values.detach().double(), t.mask) for t in (query, positive)]
    got = LateInteraction(tile_size=4)(query, positive)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), LateInteraction()(*wide), rtol=1e-5)


def test_repr_and_negatives_per_anchor():
    loss_fn = LateInteraction(0.5, query_reduction="mean", tile_size=8)
    assert repr(loss_fn) == "LateInteraction(temperature=0.5, query_reduction='mean', tile_size=8, column_tile_size=None)"
    assert loss_fn.negatives_per_anchor(16, hard_negatives=2) == 47


@pytest.mark.parametrize("options, match", [
    ({"temperature": 0}, "temperature"),
    ({"query_reduction": "max"}, "query_reduction must be one of"),
    ({"tile_size": 0}, "tile_size"),
    ({"column_tile_size": 4}, "column_tile_size=4 needs tile_size"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        LateInteraction(**options)


def _bad(case):
    query, positive = tokens(4, 5, seed=9), tokens(4, 6, seed=10)
    if case == "tensor":
        return (query.values, positive), TypeError, "query must be gradcache.TokenEmbeddings"
    if case == "mask shape":
        return (query, TokenEmbeddings(positive.values, positive.mask[:, :5])), ValueError, \
            r"positive: TokenEmbeddings.mask has shape \(4, 5\) but values has shape \(4, 6, 4\)"
    if case == "float mask":
        return (TokenEmbeddings(query.values, query.mask.double()), positive), TypeError, "query.*dtype torch.float64"
    if case == "two-valued mask":
        return (query, TokenEmbeddings(positive.values, positive.mask.long() * 3)), ValueError, r"holds \[3\]"
    if case == "empty row":
        mask = positive.mask.clone()
        mask[2] = False
        return (query, TokenEmbeddings(positive.values, mask)), ValueError, r"positive row\(s\) \[2\] have no True"
    if case == "widths":
        return (query, tokens(4, 6, dim=3)), ValueError, "widths differ"
    if case == "rows":
        return (query, tokens(3, 6)), ValueError, "positive has 3 rows but query has 4"
    if case == "negatives rows":
        return (query, positive, tokens(6, 3)), ValueError, "negatives has 6 rows, not a multiple of the 4"
    if case == "nan":
        values = query.values.detach().clone()
        values[1, 0, 0] = float("nan")
        return (TokenEmbeddings(values, query.mask), positive), NonFiniteEmbeddingError, "query has 1 NaN/inf"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["tensor", "mask shape", "float mask", "two-valued mask", "empty row", "widths",
                                  "rows", "negatives rows", "nan"])
@pytest.mark.parametrize("tile_size", [None, 2])
def test_bad_inputs_are_refused_by_name(case, tile_size):
    inputs, error, match = _bad(case)
    with pytest.raises(error, match=match):
        LateInteraction(tile_size=tile_size)(*inputs)


# --- memory --------------------------------------------------------------------------------------------------------
LQ, LD, DIM, TILE = 4, 6, 8, 8
SMALL, LARGE = 8, 32


class Allocations(TorchDispatchMode):
    """The element count of every new tensor an aten op returns (views and in-place results hold none)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        storages = {v.untyped_storage().data_ptr() for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)}
        result = func(*args, **(kwargs or {}))
        self.sizes += [v.numel() for v in tree_flatten(result)[0]
                       if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in storages]
        return result


def _audit(n: int, tile_size: int | None) -> tuple[int, int]:
    """(bytes autograd saves beyond the inputs, largest tensor allocated in forward or backward beyond the
    inputs' gradients) of one call on n queries with one hard negative each."""
    inputs = [tokens(n, LQ, DIM, seed=11), tokens(n, LD, DIM, seed=12), tokens(n, LD, DIM, seed=13)]
    own = {t.values.untyped_storage().data_ptr() for t in inputs} | {t.mask.untyped_storage().data_ptr() for t in inputs}
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if tensor.untyped_storage().data_ptr() not in own:
            saved += tensor.untyped_storage().nbytes()
        return tensor

    loss_fn = LateInteraction(tile_size=tile_size, column_tile_size=tile_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), Allocations() as forward:
        loss = loss_fn(*inputs)
    with Allocations() as backward:
        loss.backward()
    gradient_sizes = {t.values.numel() for t in inputs}
    largest = max(size for size in forward.sizes + backward.sizes if size not in gradient_sizes)
    return saved, largest


def test_the_tiled_loss_saves_and_allocates_per_example_memory_flat_in_n():
    (saved_small, largest_small), (saved_large, largest_large) = _audit(SMALL, TILE), _audit(LARGE, TILE)
    assert saved_large <= 4 * saved_small  # (N,) statistics and (N, Lq) weights: linear, nothing quadratic saved
    for n, largest in ((SMALL, largest_small), (LARGE, largest_large)):  # a block, or a row per example
        assert largest <= max(TILE * TILE * LQ * LD, n * max(LQ, LD))
    # the control: the dense loss allocates (N, 2N, Lq, Ld) similarities (16 times more at 4 N) and saves its indices
    (dense_small, dense_largest_small), (dense_large, dense_largest_large) = _audit(SMALL, None), _audit(LARGE, None)
    assert dense_large >= 8 * dense_small and dense_largest_large >= 16 * dense_largest_small
    assert dense_largest_large == LARGE * 2 * LARGE * LQ * LD


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_equals_sentence_transformers_multi_vector_loss(reduction):
    """MultiVectorMultipleNegativesRankingLoss's formula with its own scorer: cross-entropy of scale * colbert_scores
    over documents stacked per query (positive, then its h hard negatives), target column a (1 + h). The scorer
    returns float32, so the comparison is float32's."""
    pytest.importorskip("sentence_transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    import torch.nn.functional as F
    from sentence_transformers.multi_vector_encoder.scoring.colbert import colbert_scores

    n, h, scale = 6, 2, 2.0
    query, positive, negatives = tokens(n, 5, seed=14), tokens(n, 7, seed=15), tokens(n * h, 4, seed=16)
    inputs = [query, positive, negatives]
    pad = 7 - negatives.values.shape[1]
    stacked = torch.cat([positive.values[:, None], F.pad(negatives.values, (0, 0, 0, pad)).view(n, h, 7, 4)], dim=1)
    stacked_mask = torch.cat([positive.mask[:, None], F.pad(negatives.mask, (0, pad)).view(n, h, 7)], dim=1)
    scores = colbert_scores(query.values, stacked, queries_mask=query.mask, documents_mask=stacked_mask,
                            length_normalize=reduction == "mean")  # (N, N (1 + h)), query-major
    want = F.cross_entropy(scores * scale, torch.arange(n) * (1 + h))
    want_grads = gradients(want, inputs)
    for tile_size in (None, 4):
        got = LateInteraction(1 / scale, query_reduction=reduction, tile_size=tile_size)(*inputs)
        assert torch.allclose(got.float(), want, rtol=1e-5)
        for g, w in zip(gradients(got, inputs), want_grads):
            assert torch.allclose(g.float(), w.float(), rtol=1e-4, atol=1e-6)
