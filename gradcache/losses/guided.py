"""Guided filtering of false negatives (GISTEmbed): a guide model's similarities drop candidates from the softmax.

    drop (a, b) from row i  iff  g(a, b) > tau_i + eps,  tau_i = g(q_i, p_i) - margin                ("absolute")
                                                         tau_i = g(q_i, p_i) - |g(q_i, p_i)| * margin  ("relative")

g the cosine similarity of the guide's embeddings of the same texts; the positive pair (q_i, p_i) itself is never
dropped. eps (`TIE_TOLERANCE`, by the guide embeddings' dtype) makes a score equal to the threshold up to rounding
count as equal, so kept, as equal scores are by GISTEmbedLoss's strict comparison: a candidate that is the same
text as a row's positive (another row's positive reused as a hard negative, common in mined data) is scored from
an embedding of another chunk, or in another column of one matmul, and differs from g(q_i, p_i) by rounding in
either direction, so a strict comparison would keep or drop it by chance, and the chunking would decide.
The guide's embeddings are constants (computed under ``torch.no_grad``, e.g. once per GradCache step), so the
mask has no gradient; dropped logits are -inf. The rule is GISTEmbedLoss's ``mask_false_negatives``
(sentence-transformers), applied to every block InfoNCE's ``directions`` select.

Paper: Solatorio 2024, "GISTEmbed: Guided In-sample Selection of Training Negatives for Text Embedding
Fine-tuning", https://arxiv.org/abs/2402.16829.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checks import check_embeddings, check_finite_number
from .directions import score_blocks
from .precision import unit_rows

__all__ = ["MARGIN_STRATEGIES", "TIE_TOLERANCE", "check_margin_strategy", "check_guide", "false_negatives"]

MARGIN_STRATEGIES = ("absolute", "relative")
# eps by the guide embeddings' dtype: far above the rounding of equal texts encoded in other chunks (3e-7 for
# all-MiniLM-L6-v2 in float32 over batch sizes 1-30; about 1e-15 in float64), far below the gaps the filter is
# for. A guide run in lower precision than its embeddings' dtype says (TF32, autocast) rounds more than this covers.
TIE_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_GUIDE_NAMES = ("guide query", "guide positive", "guide negatives")


def check_margin_strategy(margin_strategy: object, margin: object) -> tuple[str, float]:
    """Return ``(margin_strategy, margin)`` if the strategy is "absolute" or "relative" and margin is finite."""
    if margin_strategy not in MARGIN_STRATEGIES:
        raise ValueError(f"margin_strategy must be one of {MARGIN_STRATEGIES}, got {margin_strategy!r}")
    return margin_strategy, check_finite_number(margin, "margin")


def check_guide(guide: object, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Return the guide's embeddings, one per input (query, positive[, negatives]), detached; raise if they do not fit.

    Raises:
        TypeError: ``guide`` is not a tuple or list of tensors, or one of them is not floating point.
        ValueError: a different count than the inputs, a row count that differs from its input's, a guide
            tensor that is not 2-D, widths that differ among the guide's tensors, NaN/inf entries.
    """
    if not isinstance(guide, (tuple, list)):
        raise TypeError(
            f"guide must be a tuple of the guide model's embeddings (guide_query, guide_positive[, "
            f"guide_negatives]), got {type(guide).__name__}"
        )
    if len(guide) != len(inputs):
        raise ValueError(
            f"guide has {len(guide)} tensors but the loss got {len(inputs)} inputs; pass one guide embedding "
            f"tensor per input, in the same order (query, positive[, negatives])"
        )
    named = dict(zip(_GUIDE_NAMES, guide))
    check_embeddings(**named)
    for (name, tensor), embeddings in zip(named.items(), inputs):
        if tensor.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"{name} has {tensor.shape[0]} rows but its input has {embeddings.shape[0]}; row k of each guide "
                f"tensor must embed the same text as row k of the input (under torch.distributed with gathered "
                f"embeddings, gather the guide's rows too, in rank order)"
            )
    return [tensor.detach() for tensor in guide]


@torch.no_grad()
def false_negatives(guide: Sequence[torch.Tensor], directions: Sequence[str], margin_strategy: str,
                    margin: float, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """(N, M) bool per direction: True where the guide scores the pair above row i's threshold tau_i.

    Args:
        guide: the guide's (N, D'), (N, D') and optional (N * h, D') embeddings, from ``check_guide``.
        directions: the blocks to mask, as ``score_blocks`` builds them.
    """
    tolerance = max(TIE_TOLERANCE.get(tensor.dtype, TIE_TOLERANCE[torch.float32]) for tensor in guide)
    query, *documents = (unit_rows(tensor, dtype) for tensor in guide)
    n = query.shape[0]
    stacked = torch.cat(documents)  # (N(1+h), D')
    blocks = score_blocks(query, stacked, n, stacked.shape[0], directions)
    positive_similarity = blocks["query_to_doc"][:, :n].diagonal()[:, None]  # (N, 1): g(q_i, p_i)
    if margin_strategy == "absolute":
        threshold = positive_similarity - margin
    else:
        threshold = positive_similarity - positive_similarity.abs() * margin
    masks = {}
    for name, block in blocks.items():
        mask = block > threshold + tolerance  # (N, M); within eps of tau_i is a tie, kept
        if name in ("query_to_doc", "doc_to_query"):
            mask[:, :n].diagonal().fill_(False)  # the positive pair stays: it is the target
        masks[name] = mask
    return masks
