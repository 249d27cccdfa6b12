import pytest
import torch
import torch.nn.functional as F

from gradcache.losses.tiled_logsumexp import tiled_logsumexp


def _inputs(n: int, m: int, d: int, seed: int):
    """Raw (unnormalised) rows and columns: the function normalises them itself."""
    generator = torch.Generator().manual_seed(seed)
    rows = 2.0 * torch.randn(n, d, generator=generator, dtype=torch.float64)
    columns = 0.5 * torch.randn(m, d, generator=generator, dtype=torch.float64)
    scale = torch.tensor(3.0, dtype=torch.float64)
    return rows.requires_grad_(), columns.requires_grad_(), scale.requires_grad_()


# (tile_size, column_tile_size) on 5 rows x 8 columns: square, tall, wide, single, strips, one tile.
TILES = [(1, None), (2, None), (2, 3), (3, 2), (5, 1), (2, 8), (9, 9)]


@pytest.mark.parametrize("tile_size, column_tile_size", TILES)
def test_rows_and_columns_equal_the_dense_formula(tile_size, column_tile_size):
    rows, columns, scale = _inputs(5, 8, 4, seed=tile_size)
    row_out, column_out = tiled_logsumexp(
        [rows], [columns], scale, torch.arange(5), tile_size, column_tile_size, with_columns=True
    )
    logits = scale * F.normalize(rows, dim=1) @ F.normalize(columns, dim=1).T  # (5, 8)
    diagonal = logits.diagonal()
    torch.testing.assert_close(row_out, torch.logsumexp(logits, dim=1) - diagonal, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(column_out, torch.logsumexp(logits[:, :5], dim=0) - diagonal, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("tile_size, column_tile_size", [(1, 1), (3, None), (4, 3), (2, 5), (16, None)])
def test_excluded_diagonal_and_shifted_targets_over_stacked_inputs(tile_size, column_tile_size):
    """Two inputs stacked as one set of views (NT-Xent's layout): tiles straddle the seam between them."""
    first, second, scale = _inputs(3, 3, 4, seed=0)
    views = torch.cat([first, second])  # (6, D): the reference's stack
    targets = (torch.arange(6) + 3) % 6
    row_out, column_out = tiled_logsumexp(
        [first, second], [first, second], scale, targets, tile_size, column_tile_size, exclude_diagonal=True
    )
    units = F.normalize(views, dim=1)
    logits = (scale * units @ units.T).masked_fill(torch.eye(6, dtype=torch.bool), float("-inf"))  # (6, 6)
    assert column_out is None
    expected = torch.logsumexp(logits, dim=1) - logits[torch.arange(6), targets]
    torch.testing.assert_close(row_out, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("with_columns, exclude_diagonal", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("tile_size, column_tile_size", [(3, None), (2, 3), (4, 1)])
def test_gradcheck_every_input(with_columns, exclude_diagonal, tile_size, column_tile_size):
    """Finite differences through the custom backward, with uneven upstream gradients on both outputs."""
    rows, columns, scale = _inputs(4, 6, 3, seed=1)
    targets = torch.tensor([1, 0, 3, 2]) if exclude_diagonal else torch.arange(4)
    upstream = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)

    def function(rows, columns, scale):
        column_inputs = [rows] if exclude_diagonal else [columns]
        row_out, column_out = tiled_logsumexp(
            [rows], column_inputs, scale, targets, tile_size, column_tile_size,
            with_columns=with_columns, exclude_diagonal=exclude_diagonal,
        )
        return (row_out * upstream).sum() + (0.0 if column_out is None else (column_out * upstream.flip(0)).sum())

    assert torch.autograd.gradcheck(function, (rows, columns, scale))


def test_gradcheck_columns_from_two_inputs_and_the_column_output_alone():
    """Candidates [positive; negatives] stacked inside; a backward that reaches only the column losses."""
    query, positive, scale = _inputs(3, 3, 3, seed=2)
    negatives = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()

    def both(query, positive, negatives, scale):
        row_out, column_out = tiled_logsumexp(
            [query], [positive, negatives], scale, torch.arange(3), 2, 4, with_columns=True
        )
        return row_out.sum() + (2.0 * column_out).sum()

    def columns_only(query, positive, negatives, scale):
        return tiled_logsumexp([query], [positive, negatives], scale, torch.arange(3), 2, 2, with_columns=True)[1]

    assert torch.autograd.gradcheck(both, (query, positive, negatives, scale))
    assert torch.autograd.gradcheck(columns_only, (query, positive, negatives, scale))


def test_with_columns_needs_identity_targets_and_no_excluded_diagonal():
    rows, columns, scale = _inputs(3, 3, 2, seed=3)
    with pytest.raises(ValueError, match="targets == arange"):
        tiled_logsumexp([rows], [columns], scale, torch.tensor([1, 2, 0]), 2, with_columns=True)
    with pytest.raises(ValueError, match="exclude_diagonal=False"):
        tiled_logsumexp([rows], [rows], scale, torch.arange(3), 2, with_columns=True, exclude_diagonal=True)
