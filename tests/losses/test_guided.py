"""InfoNCE with a guide (GISTEmbed's false-negative filter) against sentence-transformers' GISTEmbedLoss, a
brute-force loop, and the full-batch gradient under GradCache and CachedLoss."""

from __future__ import annotations

import math

import pytest
import torch

from gradcache.losses import InfoNCE
from gradcache.losses.guided import false_negatives

from . import brute_force, st_reference
from .strategies import assert_gradcache_equals_full_batch, batch


def _embeddings(n: int, hard_negatives: int, seed: int, width: int = 6):
    """Query, positive, negatives, and a guide that sees noisy copies of them (so it drops some candidates)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(n, width, generator=generator, dtype=torch.float64)
    positive = query + 0.8 * torch.randn(n, width, generator=generator, dtype=torch.float64)
    negatives = torch.randn(n * hard_negatives, width, generator=generator, dtype=torch.float64)
    rows = [query, positive] + ([negatives] if hard_negatives else [])
    guide = [t + 0.6 * torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in rows]
    return rows, guide


def _gist_directions(contrast_anchors: bool, contrast_positives: bool) -> tuple[str, ...]:
    return (("query_to_doc",) + (("query_to_query",) if contrast_anchors else ())
            + (("positive_to_positive",) if contrast_positives else ()))


def _value_and_grads(loss_fn, rows, **kwargs):
    leaves = [t.clone().requires_grad_() for t in rows]
    loss = loss_fn(*leaves, **kwargs)
    return loss.detach(), torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("margin_strategy, margin", [("absolute", 0.0), ("absolute", 0.1), ("relative", 0.05),
                                                     ("relative", 0.3)])
@pytest.mark.parametrize("contrast_anchors, contrast_positives", [(True, True), (False, False), (True, False),
                                                                  (False, True)])
@pytest.mark.parametrize("hard_negatives", [0, 1])
def test_equals_gist_embed_loss(margin_strategy, margin, contrast_anchors, contrast_positives, hard_negatives):
    rows, guide = _embeddings(7, hard_negatives, seed=11 + hard_negatives)
    directions = _gist_directions(contrast_anchors, contrast_positives)
    masks = false_negatives(guide, directions, margin_strategy, margin, torch.float64)
    n_off_diagonal = sum(int(m.sum()) for m in masks.values()) - 7 * (contrast_anchors + contrast_positives)
    assert n_off_diagonal > 0, "the guide drops no candidate: the test would not see the filter"
    loss_fn = InfoNCE(temperature=0.05, directions=directions, margin_strategy=margin_strategy, margin=margin)
    loss, grads = _value_and_grads(loss_fn, rows, guide=guide)
    reference, reference_grads = _value_and_grads(
        lambda query, positive, negatives=None: st_reference.gist(
            query, positive, negatives, guide, 0.05, margin_strategy, margin, contrast_anchors, contrast_positives),
        rows,
    )
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def _brute_force(rows, guide, temperature, margin_strategy, margin, directions):
    """GIST's rule as a loop: each candidate of row i kept unless its guide cosine exceeds tau_i (or it is a self
    pair / a document of query i where the direction leaves those out); the positive pair always kept."""
    query, positive, *rest = rows
    negatives = rest[0] if rest else query[:0]
    guide_query, guide_positive, *guide_rest = guide
    guide_negatives = guide_rest[0] if guide_rest else guide_query[:0]
    n, h = len(query), len(negatives) // len(query)
    documents = list(positive) + list(negatives)
    guide_documents = list(guide_positive) + list(guide_negatives)
    owner = list(range(n)) + [r // h for r in range(len(negatives))] if h else list(range(n))
    cosine = brute_force.cosine
    total = 0.0
    for i in range(n):
        g = cosine(guide_query[i], guide_positive[i]).item()
        tau = g - margin if margin_strategy == "absolute" else g - abs(g) * margin
        terms = []  # (logit, guide score or None for "always kept")
        terms += [(cosine(query[i], d), None if j == i else cosine(guide_query[i], guide_documents[j]).item())
                  for j, d in enumerate(documents)]
        if "query_to_query" in directions:
            terms += [(cosine(query[i], query[j]), cosine(guide_query[i], guide_query[j]).item())
                      for j in range(n) if j != i]
        if "doc_to_query" in directions:
            terms += [(cosine(positive[i], query[j]), None if j == i else
                       cosine(guide_positive[i], guide_query[j]).item()) for j in range(n)]
        if "doc_to_doc" in directions:
            terms += [(cosine(positive[i], d), cosine(guide_positive[i], guide_documents[j]).item())
                      for j, d in enumerate(documents) if owner[j] != i]
        if "positive_to_positive" in directions:
            terms += [(cosine(positive[i], positive[j]), cosine(guide_positive[i], guide_positive[j]).item())
                      for j in range(n) if j != i]
        kept = [logit / temperature for logit, score in terms if score is None or score <= tau]
        total = total - (cosine(query[i], positive[i]) / temperature - torch.logsumexp(torch.stack(kept), 0))
    return total / n


@pytest.mark.parametrize("directions", [
    ("query_to_doc",),
    ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc", "positive_to_positive"),
    ("query_to_doc", "doc_to_doc"),
])
@pytest.mark.parametrize("margin_strategy, margin", [("absolute", 0.05), ("relative", 0.2)])
def test_every_direction_with_two_hard_negatives_matches_a_loop(directions, margin_strategy, margin):
    rows, guide = _embeddings(5, 2, seed=3)
    loss_fn = InfoNCE(temperature=0.1, directions=directions, margin_strategy=margin_strategy, margin=margin)
    loss, grads = _value_and_grads(loss_fn, rows, guide=guide)
    reference, reference_grads = _value_and_grads(
        lambda *leaves: _brute_force(leaves, guide, 0.1, margin_strategy, margin, directions), rows)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_a_guide_that_drops_nothing_leaves_the_loss_unchanged():
    rows, guide = _embeddings(6, 1, seed=5)
    loss_fn = InfoNCE(temperature=0.05, margin=-10.0)  # tau_i = g_ii + 10 > 1 >= every cosine: nothing dropped
    torch.testing.assert_close(loss_fn(*rows, guide=guide), loss_fn(*rows), rtol=0, atol=0)


def test_a_guide_that_drops_every_negative_leaves_only_the_positive():
    rows, _ = _embeddings(4, 1, seed=6)
    same = [torch.ones_like(t) for t in rows]  # every guide cosine is 1 = g_ii > g_ii - 0.5: all dropped
    loss = InfoNCE(temperature=0.05, margin=0.5)(*rows, guide=same)
    assert loss.abs().item() < 1e-12  # -log(exp(l_ii) / exp(l_ii))


@pytest.mark.parametrize("directions, hard_negatives", [
    (("query_to_doc", "query_to_query", "positive_to_positive"), 1),
    (("query_to_doc", "doc_to_query"), 2),
])
def test_gradcache_with_a_guide_equals_the_full_batch(directions, hard_negatives):
    inputs = batch(7, hard_negatives, seed=2)
    generator = torch.Generator().manual_seed(9)
    # The guide: fixed (no-grad) embeddings of the same rows, as a GradCache step would compute them.
    guide = tuple(torch.randn(t.shape[0], 4, generator=generator, dtype=torch.float64) for t in inputs)
    loss_fn = InfoNCE(temperature=0.1, directions=directions, margin_strategy="relative", margin=0.1)
    assert any(mask.any() for mask in false_negatives(guide, directions, "relative", 0.1, torch.float64).values())
    assert_gradcache_equals_full_batch(loss_fn, inputs, guide=guide)


@pytest.mark.parametrize("guide, error, match", [
    ([torch.randn(3, 4)], ValueError, r"guide has 1 tensors but the loss got 2 inputs"),
    (torch.randn(3, 4), TypeError, r"guide must be a tuple"),
    ((torch.randn(3, 4), torch.randn(2, 4)), ValueError, r"guide positive has 2 rows but its input has 3"),
    ((torch.randn(3, 4), torch.randn(3, 5)), ValueError, r"guide positive has width 5 but guide query has width 4"),
    ((torch.randn(3, 4), torch.full((3, 4), math.nan)), ValueError, r"guide positive has 12 NaN/inf"),
    ((torch.randn(3, 4), torch.zeros(3, 4, dtype=torch.long)), TypeError, r"guide positive must have a floating"),
])
def test_a_guide_that_does_not_fit_is_refused(guide, error, match):
    with pytest.raises(error, match=match):
        InfoNCE()(torch.randn(3, 8), torch.randn(3, 8), guide=guide)


def test_a_guide_with_tiles_or_a_queue_is_refused():
    rows, guide = _embeddings(3, 0, seed=1)
    for loss_fn in (InfoNCE(tile_size=2), InfoNCE(queue_size=4)):
        with pytest.raises(ValueError, match=r"guide needs the dense loss without a queue"):
            loss_fn(*rows, guide=guide)


@pytest.mark.parametrize("kwargs, match", [
    ({"margin_strategy": "percentile"}, r"margin_strategy must be one of \('absolute', 'relative'\), got 'percentile'"),
    ({"margin": math.inf}, r"margin must be a finite real number, got inf"),
])
def test_bad_margin_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InfoNCE(**kwargs)
