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
    Equals sentence-transformers' ``FlopsLoss(model, threshold).compute_loss_from_embeddings(W)``.

    Args:
        threshold: None to regularise every row; an int to zero the rows with at most ``threshold`` non-zero
            entries first (FLOPS with L0 masking, https://arxiv.org/abs/2504.14839); they still count in N.

    Shapes: ``forward(embeddings)``: (N, V) rows (SPLADE's log(1 + relu(logits)) max-pooled over tokens).
    Returns a 0-dim tensor in the rows' dtype.

    Raises:
        TypeError, ValueError: a non-tensor, non-floating, non-2-D or empty input, or NaN/inf entries; a
            threshold that is not None or an int >= 0.

    Example:
        >>> flops = FlopsRegularizer()
        >>> flops(torch.relu(torch.randn(8, 100)))
    """

    def __init__(self, threshold: int | None = None) -> None:
        super().__init__()
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0):
            raise ValueError(
                f"threshold must be None (every row) or an int >= 0 (rows with more non-zeros count), got {threshold!r}"
            )
        self.threshold = threshold

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        check_embeddings(embeddings=embeddings)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings has 0 rows; FLOPS is the mean over a batch of at least 1")
        if self.threshold is not None:
            active = ((embeddings != 0).sum(dim=1) > self.threshold).to(embeddings.dtype)  # (N,)
            embeddings = embeddings * active.unsqueeze(1)
        return embeddings.mean(dim=0).pow(2).sum()  # (V,) -> ()

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}" if self.threshold is not None else ""


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

    def __init__(self) -> None:
        super().__init__()

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        check_embeddings(embeddings=embeddings)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings has 0 rows; L1 is the mean over a batch of at least 1")
        return embeddings.abs().sum(dim=1).mean()  # (N,) -> ()
