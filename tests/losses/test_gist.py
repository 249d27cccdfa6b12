"""GISTLoss against a per-row loop written from its formula: value and gradient of every embedding, float64."""
from __future__ import annotations

import math

import pytest
import torch

from gradcache.losses.gist import GISTLoss


def cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y) / (x.norm() * y.norm())


def brute_force(anchor, positive, negative, guides, temperature, strategy, margin, anchors, positives):
    """-1/N sum_i log softmax over row i's kept candidates, one candidate at a time."""
    ga, gp, gn = guides
    total = 0.0
    for i in range(anchor.shape[0]):
        g_pos = cosine(ga[i], gp[i])
        threshold = g_pos - (margin if strategy == "absolute" else abs(g_pos) * margin)
        terms = []
        for j in range(positive.shape[0]):  # anchor-positive; the own positive always kept
            if j == i or cosine(ga[i], gp[j]) <= threshold:
                terms.append(cosine(anchor[i], positive[j]) / temperature)
        if anchors:
            terms += [cosine(anchor[i], anchor[j]) / temperature for j in range(anchor.shape[0])
                      if cosine(ga[i], ga[j]) <= threshold]
        if positives:
            terms += [cosine(positive[i], positive[j]) / temperature for j in range(positive.shape[0])
                      if cosine(gp[i], gp[j]) <= threshold]
        if negative is not None:
            terms += [cosine(anchor[i], negative[k]) / temperature for k in range(negative.shape[0])
                      if cosine(ga[i], gn[k]) <= threshold]
        total = total - (cosine(anchor[i], positive[i]) / temperature - torch.logsumexp(torch.stack(terms), 0))
    return total / anchor.shape[0]


@pytest.mark.parametrize("strategy, margin", [("absolute", 0.0), ("absolute", 0.1), ("relative", 0.2)])
@pytest.mark.parametrize("rows, negatives", [(1, 0), (5, 0), (5, 7)])
@pytest.mark.parametrize("anchors, positives", [(True, True), (False, True), (True, False)])
def test_equals_the_formula(strategy, margin, rows, negatives, anchors, positives):
    g = torch.Generator().manual_seed(rows + negatives)
    model = [torch.randn(n, 6, generator=g, dtype=torch.float64, requires_grad=True) for n in (rows, rows, negatives)]
    guides = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (rows, rows, negatives)]  # another width
    negative, negative_guide = (model[2], guides[2]) if negatives else (None, None)
    loss = GISTLoss(0.05, strategy, margin, anchors, positives)
    got = loss(model[0], model[1], negative, anchor_guide=guides[0], positive_guide=guides[1],
               negative_guide=negative_guide)
    got_grads = torch.autograd.grad(got, model[:3 if negatives else 2])
    want = brute_force(model[0], model[1], negative, guides, 0.05, strategy, margin, anchors, positives)
    want_grads = torch.autograd.grad(want, model[:3 if negatives else 2])
    assert math.isclose(got.item(), want.item(), rel_tol=1e-10)
    for a, b in zip(got_grads, want_grads):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="margin_strategy must be one of"):
        GISTLoss(margin_strategy="cosine")
    with pytest.raises(ValueError, match="temperature"):
        GISTLoss(temperature=0.0)
    with pytest.raises(ValueError, match="margin must be a finite"):
        GISTLoss(margin=float("nan"))
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="negative without negative_guide"):
        GISTLoss()(x, x, x, anchor_guide=x, positive_guide=x)
    with pytest.raises(ValueError, match="rows"):
        GISTLoss()(x, x, anchor_guide=x[:2], positive_guide=x[:2])
