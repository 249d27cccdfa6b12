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

from gradcache.ranges import check_int
from gradcache.sparse_rows import SparseRows

from .checks import check_embeddings

__all__ = ["FlopsRegularizer", "L1Regularizer"]


class FlopsRegularizer(nn.Module):
    """FLOPS: the squared L2 norm of the mean row, sum_j (mean_i w_ij)^2 (Paria et al. 2020).

    Paper: https://arxiv.org/abs/2004.05665; SPLADE's choice (Formal et al. 2021, https://arxiv.org/abs/2107.05720).
    Equals sentence-transformers' ``FlopsLoss(model, threshold).compute_loss_from_embeddings(W)``.

    Args:
        threshold: None to regularise every row; an int to zero the rows with at most ``threshold`` non-zero
            entries first (FLOPS with L0 masking, https://arxiv.org/abs/2504.14839); they still count in N.

    Shapes: ``forward(embeddings)``: (N, V) rows (SPLADE's log(1 + relu(logits)) max-pooled over tokens), or
    their non-zeros as ``gradcache.sparse_rows.SparseRows`` (a sparse cache's, computed without making them dense).
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
        self.threshold = check_int(threshold, "threshold", at_least=0, optional="every row",
                                   meaning="rows with more non-zeros count")

    def forward(self, embeddings: torch.Tensor | SparseRows) -> torch.Tensor:
        if isinstance(embeddings, SparseRows):  # from the non-zeros: the column sums, (V,)
            values, rows, columns = _checked_non_zeros(embeddings, "FLOPS")
            if self.threshold is not None:
                counts = torch.bincount(rows, minlength=embeddings.size[0])  # (N,) non-zeros per row
                values = values * (counts > self.threshold).to(values.dtype)[rows]
            sums = values.new_zeros(embeddings.size[1]).index_add(0, columns, values)
            return (sums / embeddings.size[0]).pow(2).sum()
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

    Shapes: ``forward(embeddings)``: (N, V) rows, or their non-zeros as ``SparseRows``. Returns a 0-dim tensor in the rows' dtype.

    Raises:
        TypeError, ValueError: a non-tensor, non-floating, non-2-D or empty input, or NaN/inf entries.

    Example:
        >>> l1 = L1Regularizer()
        >>> l1(torch.relu(torch.randn(8, 100)))
    """

    def __init__(self) -> None:
        super().__init__()

    def forward(self, embeddings: torch.Tensor | SparseRows) -> torch.Tensor:
        if isinstance(embeddings, SparseRows):  # the zeros add nothing
            values, _, _ = _checked_non_zeros(embeddings, "L1")
            return values.abs().sum() / embeddings.size[0]
        check_embeddings(embeddings=embeddings)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings has 0 rows; L1 is the mean over a batch of at least 1")
        return embeddings.abs().sum(dim=1).mean()  # (N,) -> ()


def _checked_non_zeros(embeddings: SparseRows, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The values, rows and columns of sparse rows (a sparse cache's, gradcache/sparse_rows.py), checked as
    `check_embeddings` checks dense rows."""
    if embeddings.size[0] == 0:
        raise ValueError(f"embeddings has 0 rows; {name} is the mean over a batch of at least 1")
    if not torch.isfinite(embeddings.values).all():
        raise ValueError("embeddings holds NaN or infinite values")
    return embeddings.values, embeddings.indices[0].long(), embeddings.indices[1].long()
