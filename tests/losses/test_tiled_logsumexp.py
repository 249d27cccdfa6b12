import pytest
import torch

from gradcache.losses.tiled_logsumexp import tiled_logsumexp


def _inputs(n: int, m: int, d: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    rows = torch.nn.functional.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=1)
    columns = torch.nn.functional.normalize(torch.randn(m, d, generator=generator, dtype=torch.float64), dim=1)
    scale = torch.tensor(3.0, dtype=torch.float64)
    return rows.requires_grad_(), columns.requires_grad_(), scale.requires_grad_()


@pytest.mark.parametrize("tile_size", [1, 2, 5, 9])
def test_rows_and_columns_equal_the_dense_formula(tile_size):
    rows, columns, scale = _inputs(5, 8, 4, seed=tile_size)
    targets = torch.arange(5)
    positive = scale * (rows * columns[:5]).sum(dim=1)
    row_out, column_out = tiled_logsumexp(rows, columns, scale, positive, targets, tile_size, with_columns=True)
    logits = scale * rows @ columns.T  # (5, 8)
    torch.testing.assert_close(row_out, torch.logsumexp(logits, dim=1) - positive, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(column_out, torch.logsumexp(logits[:, :5], dim=0) - positive, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("tile_size", [1, 3, 16])
def test_excluded_diagonal_and_shifted_targets(tile_size):
    views, _, scale = _inputs(6, 1, 4, seed=0)
    targets = (torch.arange(6) + 3) % 6
    positive = scale * (views * views[targets]).sum(dim=1)
    row_out, column_out = tiled_logsumexp(views, views, scale, positive, targets, tile_size, exclude_diagonal=True)
    logits = (scale * views @ views.T).masked_fill(torch.eye(6, dtype=torch.bool), float("-inf"))  # (6, 6)
    assert column_out is None
    torch.testing.assert_close(row_out, torch.logsumexp(logits, dim=1) - positive, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("with_columns", [False, True])
def test_gradcheck_every_input(with_columns):
    """Finite differences through the custom backward, treating p as the free input it is to the function."""
    rows, columns, scale = _inputs(4, 6, 3, seed=1)
    positive = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    targets = torch.arange(4)
    upstream = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)

    def function(rows, columns, scale, positive):
        row_out, column_out = tiled_logsumexp(rows, columns, scale, positive, targets, 3, with_columns=with_columns)
        return (row_out * upstream).sum() + (0.0 if column_out is None else (column_out * upstream.flip(0)).sum())

    assert torch.autograd.gradcheck(function, (rows, columns, scale, positive))


def test_with_columns_needs_identity_targets():
    rows, columns, scale = _inputs(3, 3, 2, seed=3)
    with pytest.raises(ValueError, match="targets == arange"):
        tiled_logsumexp(rows, columns, scale, torch.zeros(3, dtype=torch.float64), torch.tensor([1, 2, 0]), 2,
                        with_columns=True)
