"""LateInteraction's non-finite values (issue 40 item 7): a masked position is ignored whatever it holds, NaN and
inf included (the loss and every gradient are those of zeros there); NaN/inf at a scored position is refused by
name; finite token vectors whose scores overflow float32 are refused by name instead of giving a NaN loss, and
huge ones that do not overflow give the float64 loss of the brute-force loop."""

from __future__ import annotations

import pytest
import torch

from gradcache import NonFiniteEmbeddingError, NonFiniteLossError, TokenEmbeddings
from gradcache.losses import LateInteraction
from tests.losses.test_late_interaction import tokens

TILE_SIZES = [None, 2]

# case -> (what is planted, expected error (None: the loss of zeros at masked positions), message fragment)
CASES = {
    "nan at masked query positions": ("query", "masked", float("nan"), None, ""),
    "inf at masked positive positions": ("positive", "masked", float("inf"), None, ""),
    "-inf at masked negative positions": ("negatives", "masked", float("-inf"), None, ""),
    "nan at a scored query position": ("query", "scored", float("nan"), NonFiniteEmbeddingError,
                                       "query has 1 NaN/inf values where its mask is True"),
    "inf at a scored negative position": ("negatives", "scored", float("inf"), NonFiniteEmbeddingError,
                                          "negatives has 1 NaN/inf values where its mask is True"),
    "finite values whose scores overflow": ("all", "scaled", 1e20, NonFiniteLossError,
                                            "MaxSim scores over the temperature overflow torch.float32"),
}


def _batch(dtype=torch.float64) -> dict[str, TokenEmbeddings]:
    batch = {"query": tokens(3, 4, seed=1, dtype=dtype), "positive": tokens(3, 5, seed=2, dtype=dtype),
             "negatives": tokens(6, 3, seed=3, dtype=dtype)}
    for token in batch.values():  # every row has a masked position to plant into
        token.mask[:, -1] = False
        token.mask[:, 0] = True
    return batch


def _planted(batch: dict[str, TokenEmbeddings], target: str, where: str, value: float) -> dict[str, TokenEmbeddings]:
    planted = {}
    for name, token in batch.items():
        values = token.values.detach().clone()
        if where == "scaled":
            values = values * value
        elif name == target:
            if where == "masked":
                values[~token.mask] = value
            else:
                values[1, 0, 0] = value
        planted[name] = TokenEmbeddings(values.requires_grad_(), token.mask)
    return planted


def _zeros_at_masked(batch: dict[str, TokenEmbeddings]) -> dict[str, TokenEmbeddings]:
    return {name: TokenEmbeddings(token.values.detach().masked_fill(~token.mask[..., None], 0).requires_grad_(),
                                  token.mask) for name, token in batch.items()}


@pytest.mark.parametrize("tile_size", TILE_SIZES)
@pytest.mark.parametrize("case", CASES)
def test_non_finite_values(case, tile_size):
    target, where, value, error, fragment = CASES[case]
    loss_fn = LateInteraction(temperature=0.5, tile_size=tile_size)
    dtype = torch.float32 if where == "scaled" else torch.float64
    planted = _planted(_batch(dtype), target, where, value)
    if error is not None:
        with pytest.raises(error, match=fragment):
            loss_fn(**planted)
        return
    loss = loss_fn(**planted)
    reference_inputs = _zeros_at_masked(planted)
    reference = loss_fn(**reference_inputs)
    torch.testing.assert_close(loss, reference, rtol=0, atol=0)
    names = list(planted)
    grads = torch.autograd.grad(loss, [planted[n].values for n in names])
    expected = torch.autograd.grad(reference, [reference_inputs[n].values for n in names])
    for name, grad, want in zip(names, grads, expected):
        assert torch.isfinite(grad).all(), f"{case}: {name}'s gradient is not finite"
        assert not grad[~planted[name].mask].any(), f"{case}: a masked position of {name} got a gradient"
        torch.testing.assert_close(grad, want, rtol=0, atol=0)


def float64_reference(query, positive, negatives, temperature: float) -> torch.Tensor:
    """MaxSim InfoNCE in float64 with a stable log-sum-exp (the loops of test_late_interaction.py exponentiate
    directly, which overflows at these scores): s_ab = sum_i max_j <q_ai, d_bj> over kept tokens."""
    documents = [(positive.values[b], positive.mask[b]) for b in range(len(positive.values))]
    documents += [(negatives.values[b], negatives.mask[b]) for b in range(len(negatives.values))]
    total = torch.zeros((), dtype=torch.float64)
    for a in range(len(query.values)):
        scores = torch.stack([sum(max(query.values[a, i] @ values[j] for j in range(len(values)) if mask[j])
                                  for i in range(query.values.shape[1]) if query.mask[a, i])
                              for values, mask in documents]) / temperature
        total = total + torch.logsumexp(scores, dim=0) - scores[a]
    return total / len(query.values)


@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_huge_finite_values_that_do_not_overflow_equal_float64(tile_size):
    """1e15: scores near 1e30, inside float32's range: the float32 loss is the float64 reference's."""
    batch = _planted(_batch(torch.float32), "all", "scaled", 1e15)
    loss = LateInteraction(temperature=0.5, tile_size=tile_size)(**batch)
    as_float64 = {name: TokenEmbeddings(t.values.detach().double(), t.mask) for name, t in batch.items()}
    expected = float64_reference(as_float64["query"], as_float64["positive"], as_float64["negatives"], 0.5)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=0)
