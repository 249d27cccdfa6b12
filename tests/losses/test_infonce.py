import pytest
import torch

from gradcache.losses import InfoNCE

from . import brute_force


def _inputs(n: int, d: int, hard_negatives: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(n, d, generator=generator, dtype=torch.float64)
    # Correlated positives make the target logit matter; unscaled rows check the internal normalisation.
    positive = query + 0.7 * torch.randn(n, d, generator=generator, dtype=torch.float64)
    negatives = 3 * torch.randn(n * hard_negatives, d, generator=generator, dtype=torch.float64)
    return query, positive, (negatives if hard_negatives else None)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize(
    "n, d, hard_negatives, temperature",
    [(1, 3, 0, 0.05), (1, 4, 2, 0.5), (2, 1, 0, 1.0), (5, 8, 0, 0.07), (4, 6, 1, 0.2), (3, 16, 3, 2.0)],
)
def test_dense_matches_brute_force_value_and_gradients(n, d, hard_negatives, temperature, symmetric):
    query, positive, negatives = _inputs(n, d, hard_negatives, seed=n * 100 + d)
    inputs = [t.clone().requires_grad_() for t in (query, positive, negatives) if t is not None]
    loss = InfoNCE(temperature=temperature, symmetric=symmetric)(*inputs)
    grads = torch.autograd.grad(loss, inputs)

    reference_inputs = [t.clone().requires_grad_() for t in inputs]
    reference = brute_force.infonce(
        reference_inputs[0], reference_inputs[1], reference_inputs[2] if negatives is not None else None,
        temperature, symmetric,
    )
    reference_grads = torch.autograd.grad(reference, reference_inputs)

    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, reference.detach(), rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_hard_negatives_change_the_loss():
    query, positive, negatives = _inputs(4, 8, 2, seed=1)
    loss_fn = InfoNCE(temperature=0.1)
    assert loss_fn(query, positive, negatives) > loss_fn(query, positive)


def test_negatives_grouping_does_not_matter_for_the_value():
    # Every query sees every negative, so permuting the negatives' rows leaves the loss unchanged.
    query, positive, negatives = _inputs(3, 5, 2, seed=2)
    loss_fn = InfoNCE(temperature=0.1, symmetric=True)
    shuffled = negatives[torch.randperm(negatives.shape[0], generator=torch.Generator().manual_seed(0))]
    torch.testing.assert_close(loss_fn(query, positive, negatives), loss_fn(query, positive, shuffled))


def test_negatives_not_a_multiple_of_the_batch_is_rejected():
    query, positive, _ = _inputs(3, 4, 0, seed=3)
    with pytest.raises(ValueError, match=r"negatives has 7 rows, not a multiple of the 3 queries"):
        InfoNCE()(query, positive, torch.randn(7, 4, dtype=torch.float64))
