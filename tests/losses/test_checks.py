"""Bad input is rejected with an error naming the input, before the loss touches any state."""

import pytest
import torch

from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss

# (class, names of forward's (N, D) inputs in order)
LOSSES = [(InfoNCE, ("query", "positive")), (NTXent, ("z1", "z2")), (ClipLoss, ("image", "text")),
          (SigLipLoss, ("a", "b"))]


@pytest.mark.parametrize("loss_class, _", LOSSES)
@pytest.mark.parametrize("tile_size", [0, -3, 2.0, "8", True])
def test_bad_tile_size(loss_class, _, tile_size):
    with pytest.raises(ValueError, match="tile_size"):
        loss_class(tile_size=tile_size)


@pytest.mark.parametrize("loss_class, _", LOSSES)
@pytest.mark.parametrize("column_tile_size", [0, -1, 4.0, "4", False])
def test_bad_column_tile_size(loss_class, _, column_tile_size):
    with pytest.raises(ValueError, match=rf"column_tile_size must be None .* got {column_tile_size!r}"):
        loss_class(tile_size=8, column_tile_size=column_tile_size)


@pytest.mark.parametrize("loss_class, _", LOSSES)
def test_column_tile_size_needs_a_tile_size(loss_class, _):
    with pytest.raises(ValueError, match=r"column_tile_size=16 needs tile_size set too"):
        loss_class(column_tile_size=16)
    assert loss_class(tile_size=8, column_tile_size=16).column_tile_size == 16
    assert loss_class(tile_size=8).column_tile_size is None


@pytest.mark.parametrize("loss_class, _", LOSSES)
@pytest.mark.parametrize("temperature", [0.0, -0.1, float("nan"), float("inf"), "0.1", None])
def test_bad_temperature(loss_class, _, temperature):
    with pytest.raises(ValueError, match="temperature"):
        loss_class(temperature=temperature)


def _good(n: int = 4, d: int = 6) -> list[torch.Tensor]:
    return [torch.randn(n, d), torch.randn(n, d)]


@pytest.mark.parametrize("tile_size", [None, 2])
@pytest.mark.parametrize("loss_class, names", LOSSES)
def test_bad_embeddings_name_the_input(loss_class, names, tile_size):
    loss_fn = loss_class(tile_size=tile_size)
    before = [p.detach().clone() for p in loss_fn.state_dict().values()]
    first, second = names

    a, b = _good()
    b[1, 2], b[3, 0], b[0, 0] = float("nan"), float("inf"), float("-inf")
    with pytest.raises(ValueError, match=rf"^{second} has 3 NaN/inf entries"):
        loss_fn(a, b)
    with pytest.raises(ValueError, match=rf"{second} has width 5 but {first} has width 6"):
        loss_fn(torch.randn(4, 6), torch.randn(4, 5))
    with pytest.raises(ValueError, match=rf"{second} has 3 rows but {first} has 4"):
        loss_fn(torch.randn(4, 6), torch.randn(3, 6))
    with pytest.raises(ValueError, match=rf"{first} must be 2-D"):
        loss_fn(torch.randn(4, 6, 1), torch.randn(4, 6))
    with pytest.raises(TypeError, match=rf"{second} must have a floating dtype"):
        loss_fn(torch.randn(4, 6), torch.ones(4, 6, dtype=torch.long))
    with pytest.raises(TypeError, match=rf"{first} must be a torch.Tensor"):
        loss_fn([[1.0, 2.0]], torch.randn(1, 2))
    with pytest.raises(ValueError, match=rf"{first} has 0 rows"):
        loss_fn(torch.randn(0, 6), torch.randn(0, 6))

    for value, after in zip(before, loss_fn.state_dict().values()):
        assert torch.equal(value, after)


def test_negatives_are_checked_by_name():
    query, positive = _good()
    negatives = torch.randn(8, 6)
    negatives[5, 1] = float("nan")
    with pytest.raises(ValueError, match="negatives has 1 NaN/inf entries"):
        InfoNCE()(query, positive, negatives)
    with pytest.raises(ValueError, match="negatives has width 3 but query has width 6"):
        InfoNCE()(query, positive, torch.randn(8, 3))
