"""Scores and losses from sparse rows' non-zeros (gradcache/losses/sparse_scores.py) against the same computed on
dense rows with plain autograd, float64: values, and gradients at every non-zero (the zeros of a sparse cache
pass no gradient, gradcache/sparse_rows.py); blocks of rows forced small so that several are used."""
from __future__ import annotations

import pytest
import torch

from gradcache.losses import InfoNCE, SpladeLoss
from gradcache.losses import sparse_scores as module
from gradcache.losses.sparse_scores import plain_dot_infonce, sparse_scores, take_rows
from gradcache.losses.sparsity import FlopsRegularizer, L1Regularizer
from gradcache.sparse_rows import SparseRows, compress

V = 40


def rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(n, V, generator=g, dtype=torch.float64) - 0.8)  # about 20% non-zeros


def leaves(dense: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[SparseRows]]:
    """Dense leaves, and the same rows as SparseRows whose values are leaves."""
    sparse = [compress(d, f"rows {i}") for i, d in enumerate(dense)]
    return ([d.clone().requires_grad_() for d in dense],
            [s._replace(values=s.values.clone().requires_grad_()) for s in sparse])


def assert_gradients_at_non_zeros(dense: list[torch.Tensor], sparse: list[SparseRows]) -> None:
    for d, s in zip(dense, sparse):
        expected = d.grad[s.indices[0].long(), s.indices[1].long()]
        torch.testing.assert_close(s.values.grad, expected, rtol=1e-12, atol=1e-15)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(module, "BLOCK_ELEMENTS", 3 * V)  # blocks of 3 rows: several per call


def test_scores_and_their_gradient_equal_the_dense_product():
    dense, sparse = leaves([rows(7, 0), rows(11, 1)])
    weights = torch.randn(7, 11, dtype=torch.float64)
    (dense[0] @ dense[1].T * weights).sum().backward()
    got = sparse_scores(*sparse)
    torch.testing.assert_close(got, dense[0].detach() @ dense[1].detach().T, rtol=1e-12, atol=1e-15)
    (got * weights).sum().backward()
    assert_gradients_at_non_zeros(dense, sparse)


@pytest.mark.parametrize("regularizer", [FlopsRegularizer(), FlopsRegularizer(threshold=8), L1Regularizer()])
@pytest.mark.parametrize("hard_negatives", [0, 2])
def test_splade_loss_from_non_zeros_equals_the_dense_loss(regularizer, hard_negatives):
    columns = [rows(6, 2), rows(6, 3)] + ([rows(6 * hard_negatives, 4)] if hard_negatives else [])
    loss_fn = SpladeLoss(InfoNCE(temperature=0.7, similarity="dot"), 0.3, 0.2, document_regularizer=regularizer,
                         query_regularizer=regularizer)
    dense, sparse = leaves(columns)
    expected = loss_fn(*dense)
    expected_parts = loss_fn.parts
    expected.backward()
    got = loss_fn(*sparse)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    for name, value in expected_parts.items():
        torch.testing.assert_close(loss_fn.parts[name], value, rtol=1e-12, atol=1e-15)
    got.backward()
    assert_gradients_at_non_zeros(dense, sparse)


def test_a_base_loss_it_cannot_compute_from_non_zeros_gets_the_rows_made_dense():
    loss_fn = SpladeLoss(InfoNCE(temperature=0.5, similarity="dot", symmetric=True), 0.1, 0.1)
    dense, sparse = leaves([rows(5, 5), rows(5, 6)])
    expected = loss_fn(*dense)
    expected.backward()
    got = loss_fn(*sparse)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    got.backward()
    assert_gradients_at_non_zeros(dense, sparse)


def test_which_losses_are_plain_inf_nce_by_dot_product():
    assert plain_dot_infonce(InfoNCE(temperature=0.3, similarity="dot")) == 0.3
    assert plain_dot_infonce(InfoNCE(temperature=0.3)) is None  # cosine
    assert plain_dot_infonce(InfoNCE(temperature=0.3, similarity="dot", symmetric=True)) is None
    assert plain_dot_infonce(InfoNCE(temperature=0.3, similarity="dot", queue_size=4)) is None
    assert plain_dot_infonce(torch.nn.MSELoss()) is None


def test_take_rows_keeps_the_rows_asked_for_in_order():
    dense = rows(6, 7)
    taken = take_rows(compress(dense, "rows"), torch.tensor([1, 4, 5]))
    restored = torch.zeros(3, V, dtype=torch.float64)
    restored[taken.indices[0].long(), taken.indices[1].long()] = taken.values
    torch.testing.assert_close(restored, dense[[1, 4, 5]], rtol=0, atol=0)
