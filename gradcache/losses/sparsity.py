"""The sparsity regularisers of SPLADE over the batch's (N, V) vocabulary-sized rows: FLOPS and L1.

    FLOPS(W) = sum_j (1/N sum_i w_ij)^2          L1(W) = 1/N sum_i sum_j |w_ij|

Both are functions of the batch as a whole. Under GradCache, CachedLoss and FullBatch with ``gather=True`` the loss
receives every rank's rows (gathered, ordered by rank), so N is the global batch and the value is that of one
process on the concatenated batch, whatever the number of ranks: the mean over the global batch is the scaling
that keeps the regularisation independent of the world size (a per-rank mean averaged over ranks would not be
FLOPS: the square of a mean is not the mean of the squares).
"""

from __future__ import annotations

import torch
from torch import nn

from .checks import check_embeddings

__all__ = ["FlopsRegularizer", "L1Regularizer"]


class FlopsRegularizer(nn.Module):
    """FLOPS: the squared L2 norm of the mean row, sum_j (mean_i w_ij)^2 (Paria et al. 2020).

    Paper: https://arxiv.org/abs/2004.05665; SPLADE's choice (Formal et al. 2021, https://arxiv.org/abs/2107.05720).
    Equals sentence-transformers' ``FlopsLoss(model).compute_loss_from_embeddings(W)`` (its ``threshold=None``).

    Shapes: ``forward(embeddings)``: (N, V) rows (SPLADE's log(1 + relu(logits)) max-pooled over tokens).
    Returns a 0-dim tensor in the rows' dtype.

    Raises:
        TypeError, ValueError: a non-tensor, non-floating, non-2-D or empty input, or NaN/inf entries.

    Example:
        >>> flops = FlopsRegularizer()
        >>> flops(torch.relu(torch.randn(8, 100)))
    """

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        check_embeddings(embeddings=embeddings)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings has 0 rows; FLOPS is the mean over a batch of at least 1")
        return embeddings.mean(dim=0).pow(2).sum()  # (V,) -> ()


class L1Regularizer(nn.Module):
    """L1: the mean over rows of each row's L1 norm, 1/N sum_i sum_j |w_ij|.

    The regulariser of SPLADE's sparse queries in inference-free setups (Geng et al. 2024,
    https://arxiv.org/abs/2411.04403) and the classic sparsity penalty (Zamani et al. 2018, SNRM).

    Shapes: ``forward(embeddings)``: (N, V) rows. Returns a 0-dim tensor in the rows' dtype.

    Raises:
        TypeError, ValueError: a non-tensor, non-floating, non-2-D or empty input, or NaN/inf entries.

    Example:
        >>> l1 = L1Regularizer()
        >>> l1(torch.relu(torch.randn(8, 100)))
    """

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        check_embeddings(embeddings=embeddings)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings has 0 rows; L1 is the mean over a batch of at least 1")
        return embeddings.abs().sum(dim=1).mean()  # (N,) -> ()
