"""The non-finite errors are told apart by type: a NaN embedding and a NaN loss, each a NonFiniteError."""
import pytest
import torch

from gradcache import FullBatch, NonFiniteEmbeddingError, NonFiniteError, NonFiniteLossError
from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss


@pytest.mark.parametrize("loss", [InfoNCE(), ClipLoss(), NTXent(), SigLipLoss()], ids=type)
def test_a_nan_embedding_raises_non_finite_embedding_error(loss):
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    x[1, 2] = float("nan")
    with pytest.raises(NonFiniteEmbeddingError, match="1 NaN/inf entries") as raised:
        loss(x, y)
    assert isinstance(raised.value, NonFiniteError) and isinstance(raised.value, ValueError)


def test_a_nan_loss_raises_non_finite_loss_error_and_writes_no_gradient():
    encoder = torch.nn.Linear(3, 3)
    strategy = FullBatch(encoder, lambda x, y: (x * y).sum() * float("inf"))
    with pytest.raises(NonFiniteLossError) as raised:
        strategy.step(torch.randn(4, 3), torch.randn(4, 3))
    assert isinstance(raised.value, NonFiniteError)
    assert all(parameter.grad is None for parameter in encoder.parameters())
