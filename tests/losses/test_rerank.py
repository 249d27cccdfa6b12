"""ListwiseRerank and PointwiseRerank against brute-force loops written from their formulas, and GradCache over a
tiny cross-encoder fed raw text pairs (PairScorer, TextPairs) against an uncached brute-force pass: float64,
dropout on, every parameter (the loss's activation's included), chunks that divide the group and chunks that cut it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache, PairScorer, TextPairs, split_pairs
from gradcache.losses import ListwiseRerank, PointwiseRerank
from tests.conftest import assert_grads_close, grads_of, mlp, zero
from tests.tiny_cross_encoder import grouped_pairs, write_tiny_cross_encoder



class Affine(nn.Module):
    """a(s) = w s + b: an activation with parameters, so the loss has some to train."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(1.3, dtype=torch.float64))
        self.bias = nn.Parameter(torch.tensor(-0.2, dtype=torch.float64))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return self.weight * scores + self.bias


def listwise_loop(scores: list[torch.Tensor], group_size: int, temperature: float, activation) -> torch.Tensor:
    """-1/N sum_i log(exp(a(s_i0)/t) / sum_j exp(a(s_ij)/t)), one query at a time."""
    total, groups = 0.0, len(scores) // group_size
    for i in range(groups):
        z = [(activation(s) if activation is not None else s) / temperature
             for s in scores[i * group_size : (i + 1) * group_size]]
        total = total - (z[0] - torch.log(sum(torch.exp(v) for v in z)))
    return total / groups


def pointwise_loop(scores: list[torch.Tensor], labels: list[float], temperature: float, activation,
                   pos_weight: float | None) -> torch.Tensor:
    """-1/M sum_j [w y_j log sigma(z_j) + (1 - y_j) log(1 - sigma(z_j))], one pair at a time."""
    w = 1.0 if pos_weight is None else pos_weight
    total = 0.0
    for s, y in zip(scores, labels):
        z = (activation(s) if activation is not None else s) / temperature
        total = total - (w * y * torch.log(torch.sigmoid(z)) + (1 - y) * torch.log(1 - torch.sigmoid(z)))
    return total / len(scores)


# --- the formulas ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_size,queries", [(2, 1), (5, 3)])
@pytest.mark.parametrize("temperature,activation", [(1.0, None), (0.1, nn.Sigmoid()), (0.5, "affine")])
@pytest.mark.parametrize("column", [False, True])
def test_listwise_equals_the_loop(group_size, queries, temperature, activation, column):
    activation = Affine() if activation == "affine" else activation
    scores = torch.randn(queries * group_size, dtype=torch.float64)
    scores = scores[:, None] if column else scores
    got_scores = scores.clone().requires_grad_()
    want_scores = scores.clone().requires_grad_()
    loss_fn = ListwiseRerank(temperature, activation=activation)
    got = loss_fn(got_scores, group_size=group_size)
    got.backward()
    got_params = {n: p.grad.clone() for n, p in loss_fn.named_parameters()}
    loss_fn.zero_grad()
    want = listwise_loop(list(want_scores.reshape(-1)), group_size, temperature, activation)
    want.backward()
    assert got.dtype == torch.float64 and got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(got_scores.grad, want_scores.grad, rtol=1e-10, atol=1e-12)
    for name, parameter in loss_fn.named_parameters():
        torch.testing.assert_close(got_params[name], parameter.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature,activation,pos_weight", [(1.0, None, None), (0.5, nn.Sigmoid(), 2.0),
                                                               (2.0, "affine", 0.5)])
def test_pointwise_equals_the_loop(temperature, activation, pos_weight):
    activation = Affine() if activation == "affine" else activation
    scores = torch.randn(7, dtype=torch.float64)
    labels = [1.0, 0.0, 0.0, 1.0, 0.3, 0.0, 1.0]
    got_scores, want_scores = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    loss_fn = PointwiseRerank(temperature, activation=activation, pos_weight=pos_weight)
    got = loss_fn(got_scores[:, None], labels=torch.tensor(labels, dtype=torch.float64))
    got.backward()
    got_params = {n: p.grad.clone() for n, p in loss_fn.named_parameters()}
    loss_fn.zero_grad()
    want = pointwise_loop(list(want_scores), labels, temperature, activation, pos_weight)
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(got_scores.grad, want_scores.grad, rtol=1e-10, atol=1e-12)
    for name, parameter in loss_fn.named_parameters():
        torch.testing.assert_close(got_params[name], parameter.grad, rtol=1e-10, atol=1e-12)


def test_negatives_per_anchor_counts_the_group():
    assert ListwiseRerank().negatives_per_anchor(8, hard_negatives=4) == 4
    assert PointwiseRerank().negatives_per_anchor(8, hard_negatives=4) == 0


# --- GradCache against FullBatch on torch alone ------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [2, 3, 5], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("kind", ["listwise", "pointwise"])
def test_gradcache_and_cached_loss_equal_full_batch_with_dropout(kind, chunk_size):
    """A scorer of (M, 10) pair features with dropout (its masks row by row, so chunked and whole draw alike):
    GradCache and CachedLoss equal one full-batch pass on every parameter, chunks of 2 dividing the group of 4,
    chunks of 3 and 5 cutting groups in two."""
    torch.manual_seed(0)
    scorer = mlp(10, 16, 1, dropout=0.1).double()
    activation = Affine()
    pairs = torch.randn(3 * 4, 10, dtype=torch.float64)
    if kind == "listwise":
        loss_fn, kwargs = ListwiseRerank(0.3, activation=activation), {"group_size": 4}
    else:
        loss_fn = PointwiseRerank(0.7, activation=activation, pos_weight=2.0)
        kwargs = {"labels": torch.tensor([1.0, 0.0, 0.0, 0.0] * 3, dtype=torch.float64)}
    results = {}
    for name, run in {
        "full": lambda: FullBatch(scorer, loss_fn).step(pairs, **kwargs),
        "gradcache": lambda: GradCache(scorer, loss_fn, chunk_size).step(pairs, **kwargs),
        "cached_loss": lambda: CachedLoss(scorer, loss_fn, chunk_size)(pairs, **kwargs).backward(),
    }.items():
        zero(scorer, loss_fn)
        torch.manual_seed(1)
        run()
        results[name] = grads_of(scorer, loss_fn)
    assert_grads_close(results["gradcache"], results["full"], rel=1e-10)
    assert_grads_close(results["cached_loss"], results["full"], rel=1e-10)


# --- GradCache over a cross-encoder fed raw pairs ----------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    pytest.importorskip("transformers")  # the formulas above run on torch alone (the CI's torch-floor stage)
    return write_tiny_cross_encoder(tmp_path_factory.mktemp("cross_encoder"), dropout=0.1)


_LOADED: dict[str, PairScorer] = {}


def scorer_from(folder) -> PairScorer:
    """A fresh copy of the folder's model (loaded once per folder), float64, in train mode."""
    import transformers

    if str(folder) not in _LOADED:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).double()
        _LOADED[str(folder)] = PairScorer(model, transformers.AutoTokenizer.from_pretrained(str(folder)))
    return copy.deepcopy(_LOADED[str(folder)]).train()


def brute_force(scorer: PairScorer, pairs: TextPairs, chunk_size: int, loss_of) -> tuple[float, torch.Tensor]:
    """The uncached reference: every chunk encoded with its graph, in order from the same seed (so the same
    dropout masks as GradCache's phase (1)), the loss by its loop, one backward."""
    torch.manual_seed(1)
    scores = torch.cat([scorer(chunk) for chunk in split_pairs(pairs, chunk_size)])
    loss = loss_of(list(scores))
    loss.backward()
    return loss.item(), scores.detach()


GROUP, QUERIES = 4, 3  # 12 pairs


@pytest.mark.parametrize("strategy,chunk_size", [("gradcache", 2), ("gradcache", 3), ("gradcache", 5),
                                                 ("cached_loss", 3)])
def test_listwise_gradcache_over_raw_pairs_equals_brute_force(folder, chunk_size, strategy):
    """Chunks of 2 divide the group of 4; 3 and 5 cut groups in two."""
    scorer, activation = scorer_from(folder), Affine()
    loss_fn = ListwiseRerank(0.5, activation=activation)
    pairs = TextPairs(grouped_pairs(QUERIES, GROUP))
    want_loss, _ = brute_force(scorer, pairs, chunk_size, lambda s: listwise_loop(s, GROUP, 0.5, activation))
    want = grads_of(scorer, loss_fn)
    zero(scorer, loss_fn)
    torch.manual_seed(1)
    if strategy == "gradcache":
        got_loss = GradCache(scorer, loss_fn, chunk_size, split_fn=split_pairs).step(pairs, group_size=GROUP)
    else:
        got_loss = CachedLoss(scorer, loss_fn, chunk_size, split_fn=split_pairs)(pairs, group_size=GROUP)
        got_loss.backward()
    assert got_loss.item() == pytest.approx(want_loss, rel=1e-10)
    assert_grads_close(grads_of(scorer, loss_fn), want, rel=1e-8)


@pytest.mark.parametrize("chunk_size", [5])
def test_pointwise_gradcache_over_raw_pairs_equals_brute_force(folder, chunk_size):
    scorer = scorer_from(folder)
    loss_fn = PointwiseRerank(pos_weight=3.0)
    pairs = TextPairs(grouped_pairs(QUERIES, GROUP))
    labels = [1.0 if j == 0 else 0.0 for _ in range(QUERIES) for j in range(GROUP)]
    want_loss, _ = brute_force(scorer, pairs, chunk_size, lambda s: pointwise_loop(s, labels, 1.0, None, 3.0))
    want = grads_of(scorer)
    zero(scorer)
    torch.manual_seed(1)
    got_loss = GradCache(scorer, loss_fn, chunk_size, split_fn=split_pairs).step(pairs, labels=torch.tensor(labels, dtype=torch.float64))
    assert got_loss.item() == pytest.approx(want_loss, rel=1e-10)
    assert_grads_close(grads_of(scorer), want, rel=1e-8)


def test_gradcache_equals_full_batch_without_dropout(tmp_path):
    """Without dropout, chunked tokenisation (each chunk padded to its own longest) changes nothing: GradCache
    in chunks that cut the groups equals one full-batch pass over all 12 pairs tokenised at once."""
    pytest.importorskip("transformers")
    scorer = scorer_from(write_tiny_cross_encoder(tmp_path, dropout=0.0))
    loss_fn = ListwiseRerank(0.2, activation=nn.Sigmoid())
    pairs = TextPairs(grouped_pairs(QUERIES, GROUP))
    want_loss = FullBatch(scorer, loss_fn).step(pairs, group_size=GROUP)
    want = grads_of(scorer)
    zero(scorer)
    got_loss = GradCache(scorer, loss_fn, 5, split_fn=split_pairs).step(pairs, group_size=GROUP)
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=1e-10)
    assert_grads_close(grads_of(scorer), want, rel=1e-8)


# --- bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_size,match", [(1, "group_size must be an int >= 2"), (5, "not a multiple"),
                                              (2.0, "group_size must be")])
def test_listwise_refuses_a_group_size_that_cannot_be_right(group_size, match):
    with pytest.raises(ValueError, match=match):
        ListwiseRerank()(torch.randn(12), group_size=group_size)


def test_gradcache_refuses_scores_that_are_not_whole_groups_before_any_grad(folder):
    scorer = scorer_from(folder)
    zero(scorer)
    with pytest.raises(ValueError, match="got 12 scores, not a multiple of group_size=5"):
        GradCache(scorer, ListwiseRerank(), 5, split_fn=split_pairs).step(
            TextPairs(grouped_pairs(QUERIES, GROUP)), group_size=5)
    assert all(p.grad is None for p in scorer.parameters())


@pytest.mark.parametrize("scores,error,match", [
    (torch.randn(6, 2), ValueError, r"\(M,\) or \(M, 1\)"),
    (torch.ones(6, dtype=torch.long), TypeError, "floating dtype"),
    ([0.1, 0.2], TypeError, "torch.Tensor"),
    (torch.tensor([0.1, float("nan")]), ValueError, "NaN/inf"),
])
def test_bad_scores_are_named(scores, error, match):
    with pytest.raises(error, match=match):
        ListwiseRerank()(scores, group_size=2)


@pytest.mark.parametrize("labels,match", [(torch.tensor([1.0, 0.0]), "2 values for 3 scores"),
                                          (torch.tensor([1.0, 2.0, 0.0]), r"in \[0, 1\]")])
def test_pointwise_refuses_bad_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        PointwiseRerank()(torch.randn(3), labels=labels)


@pytest.mark.parametrize("make,error,match", [
    (lambda: ListwiseRerank(0.0), ValueError, "temperature"),
    (lambda: ListwiseRerank(activation="sigmoid"), TypeError, "activation must be"),
    (lambda: PointwiseRerank(pos_weight=0), ValueError, "pos_weight"),
    (lambda: TextPairs([("a", "b"), ("c",)]), TypeError, r"pairs\[1\]"),
    (lambda: TextPairs([]), ValueError, "empty"),
    (lambda: TextPairs("ab"), TypeError, "list of"),
    (lambda: split_pairs([("a", "b")], 2), TypeError, "TextPairs"),
])
def test_bad_options_and_pairs_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_chunk_size_zero_is_refused(folder):
    with pytest.raises(ValueError, match="chunk_size"):
        GradCache(scorer_from(folder), ListwiseRerank(), 0, split_fn=split_pairs)


def test_text_pairs_slice_and_repr():
    pairs = TextPairs([("q", "a"), ("q", "b"), ("r", "c")])
    assert isinstance(pairs[1:], TextPairs) and list(pairs[1:]) == [("q", "b"), ("r", "c")]
    assert pairs.queries == ["q", "q", "r"] and pairs.candidates == ["a", "b", "c"]
    assert [len(c) for c in split_pairs(pairs, 2)] == [2, 1] and repr(pairs) == "TextPairs(3 pairs)"
