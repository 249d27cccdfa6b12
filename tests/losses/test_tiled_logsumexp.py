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
    row_out, column_out = tiled_logsumexp(rows, columns, scale, torch.arange(5), tile_size, with_columns=True)
    logits = scale * rows @ columns.T  # (5, 8)
    diagonal = logits.diagonal()
    torch.testing.assert_close(row_out, torch.logsumexp(logits, dim=1) - diagonal, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(column_out, torch.logsumexp(logits[:, :5], dim=0) - diagonal, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("tile_size", [1, 3, 16])
def test_excluded_diagonal_and_shifted_targets(tile_size):
    views, _, scale = _inputs(6, 1, 4, seed=0)
    targets = (torch.arange(6) + 3) % 6
    row_out, column_out = tiled_logsumexp(views, views, scale, targets, tile_size, exclude_diagonal=True)
    logits = (scale * views @ views.T).masked_fill(torch.eye(6, dtype=torch.bool), float("-inf"))  # (6, 6)
    assert column_out is None
    expected = torch.logsumexp(logits, dim=1) - logits[torch.arange(6), targets]
    torch.testing.assert_close(row_out, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("with_columns, exclude_diagonal", [(False, False), (True, False), (False, True)])
def test_gradcheck_every_input(with_columns, exclude_diagonal):
    """Finite differences through the custom backward, with uneven upstream gradients on both outputs."""
    rows, columns, scale = _inputs(4, 6, 3, seed=1)
    if exclude_diagonal:
        columns = rows
    targets = torch.tensor([1, 0, 3, 2]) if exclude_diagonal else torch.arange(4)
    upstream = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)

    def function(rows, columns, scale):
        row_out, column_out = tiled_logsumexp(
            rows, columns, scale, targets, 3, with_columns=with_columns, exclude_diagonal=exclude_diagonal
        )
        return (row_out * upstream).sum() + (0.0 if column_out is None else (column_out * upstream.flip(0)).sum())

    assert torch.autograd.gradcheck(function, (rows, columns, scale))


def test_with_columns_needs_identity_targets_and_no_excluded_diagonal():
    rows, columns, scale = _inputs(3, 3, 2, seed=3)
    with pytest.raises(ValueError, match="targets == arange"):
        tiled_logsumexp(rows, columns, scale, torch.tensor([1, 2, 0]), 2, with_columns=True)
    with pytest.raises(ValueError, match="exclude_diagonal=False"):
        tiled_logsumexp(rows, rows, scale, torch.arange(3), 2, with_columns=True, exclude_diagonal=True)
