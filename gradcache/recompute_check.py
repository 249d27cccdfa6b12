"""Phase (3)'s check that a re-encoded chunk is the chunk phase (1) cached: max |e3 - e1| <= tolerance * max |e1|.

Phase (3) back-propagates the cached gradient d loss / d e1 through a second forward e3 of the same chunk. The
gradient is that of the loss returned only when e3 equals e1; when they differ (randomness the replay does not
cover, state changed between the passes, a kernel that is nondeterministic) the gradient belongs to another
forward than the loss saw, and nothing else would notice. So each re-encoded chunk is compared with its cached
embedding before its backward, at the cost of one reduction and one host sync per chunk (chunk-sized
temporaries; nothing kept beyond what phase (1) caches). Kept graphs (memory_budget) and frozen towers are not
recomputed and need no check.

The tolerance is relative to the chunk's largest cached entry and follows the lowest precision the forward ran
in (the embedding's dtype, the encoder's floating parameters, autocast on the embedding's device):

    float64 1e-7 | float32 1e-4 (1e-3 on CUDA where TF32 is on) | float16 1e-2 | bfloat16 5e-2

TF32 is on for an encoder when float32 matmuls allow it, or when cuDNN does (its default) and the encoder holds a
convolution or an RNN (gradcache/tf32.py reads torch's current API, which reports the legacy flags too).

A deterministic encoder repeats itself bit for bit on the same device with the same kernels; the room above
that is for what legitimately differs between a forward without a graph (1) and one with it (3): another kernel
or fusion (torch.compile builds an inference and a training graph; attention picks its backend by grad mode),
another accumulation order (atomics in scatter or index_add on CUDA). Those move an entry by a few units of
the lowest precision used, relative to the chunk's scale; an uncovered dropout mask or a changed weight moves it
by a share of the scale, far above. `check_recompute=False` turns the check off; a float sets the tolerance.

Token embeddings are compared where they count: both masks must be equal, and the values are compared at the
positions the mask keeps (a loss ignores the others).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gradcache.non_finite import NonFiniteRecomputationError
from gradcache.autocast import AutocastState, compute_device_type
from gradcache.tf32 import tf32_in_use
from gradcache.token_embeddings import Embedding, TokenEmbeddings

TOLERANCES = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
TF32_TOLERANCE = 1e-3

_AFTER = (
    "No gradient of this chunk was written; every .grad that was None when the step began (after "
    "optimizer.zero_grad()) is None again, and a .grad that held earlier steps' gradients holds part of this "
    "step's: zero it before the next step."
)


class RecomputationMismatchError(RuntimeError):
    """Phase (3) re-encoded a chunk and got another embedding than phase (1) cached; no gradient of it was written."""


@dataclass(frozen=True)
class RecomputeCheck:
    """The comparison of one encoder's re-encoded chunks with their cached embeddings."""

    tolerance: float  # relative to the chunk's largest cached entry
    given: bool  # the user's own tolerance (check_recompute=0.05): used as is, whatever the dtypes
    tf32: bool = False  # the encoder's float32 forward on CUDA may run in TF32 (`tf32_in_use`)

    @classmethod
    def for_encoder(cls, encoder: nn.Module, setting: bool | float) -> RecomputeCheck | None:
        """None when `check_recompute=False`; else the tolerance of the encoder's lowest-precision parameter."""
        if setting is False:
            return None
        if setting is not True:
            return cls(float(setting), given=True)
        tf32 = tf32_in_use(encoder)
        tolerances = [_tolerance(p.dtype, compute_device_type(p), tf32) for p in encoder.parameters()
                      if p.is_floating_point()]
        return cls(max(tolerances, default=0.0), given=False, tf32=tf32)

    def __call__(
        self, recomputed: Embedding, cached: Embedding, autocast_state: AutocastState, name: str, chunk: str,
    ) -> None:
        """Raise unless `recomputed` (the phase (3) forward) matches `cached` (phase (1)), before its backward."""
        if isinstance(recomputed, TokenEmbeddings) or isinstance(cached, TokenEmbeddings):
            recomputed, cached = _where_scored(recomputed, cached, name, chunk)
        tolerance = self.tolerance
        if not self.given:
            tolerance = max(tolerance, _forward_tolerance(recomputed, autocast_state, self.tf32))
        with torch.no_grad():
            new, old = recomputed.detach(), cached.detach()
            if new.shape != old.shape:
                raise RecomputationMismatchError(
                    f"phase (3) re-encoded {chunk} of {name} into shape {tuple(new.shape)}, but phase (1) cached "
                    f"{tuple(old.shape)}: the encoder's second pass differs from its first. {_CAUSES} {_AFTER}"
                )
            wide = torch.promote_types(new.dtype, torch.float32)
            largest = [(new.to(wide) - old.to(wide)).abs().amax(), old.abs().amax().to(wide)]
            difference, scale = torch.stack(largest).tolist()  # one host sync
            if difference <= tolerance * scale:  # False for NaN: the slow path below says what happened
                return
            difference, scale = _finite_difference(new.to(wide), old.to(wide), name, chunk)
            if difference <= tolerance * scale:
                return
        raise RecomputationMismatchError(
            f"phase (3) re-encoded {chunk} of {name} and got another embedding than phase (1) cached: max "
            f"|difference| {difference:.3g}, {difference / scale if scale else float('inf'):.3g} of the chunk's "
            f"largest entry {scale:.3g}, above the tolerance {tolerance:.3g} of it "
            f"({'check_recompute' if self.given else 'for the precision the forward ran in'}). The gradient would be "
            f"that of another forward than the loss saw. {_CAUSES} {_AFTER}"
        )


_CAUSES = (
    "Likely causes: randomness the replay does not cover (Python's random, NumPy, a generator of your own; torch's "
    "CPU and CUDA generators are replayed), state changed between the passes (a counter or cache in the encoder, "
    "weights or buffers updated between the loss and its backward), a torch.compile'd encoder that recompiled or "
    "fell back to eager between the passes (its dropout then draws other masks), a wrapper that patches the "
    "encoder's forward for the first pass only (sentence-transformers' MatryoshkaLoss or AdaptiveLayerLoss around "
    "a loss that does not go through calculate_loss), or nondeterministic kernels. "
    "For an encoder known to be nondeterministic, pass check_recompute=False, or a looser relative tolerance "
    "(e.g. 0.1)."
)


def _where_scored(
    recomputed: Embedding, cached: Embedding, name: str, chunk: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both values, zero where the mask drops a position; RecomputationMismatchError where the masks (or the
    kinds of embedding) differ."""
    if not (isinstance(recomputed, TokenEmbeddings) and isinstance(cached, TokenEmbeddings)):
        kinds = ["token embeddings" if isinstance(e, TokenEmbeddings) else "a tensor" for e in (recomputed, cached)]
        raise RecomputationMismatchError(
            f"phase (3) re-encoded {chunk} of {name} into {kinds[0]}, but phase (1) cached {kinds[1]}: the "
            f"encoder's second pass differs from its first. {_CAUSES} {_AFTER}"
        )
    if recomputed.mask.shape != cached.mask.shape or not torch.equal(recomputed.mask, cached.mask):
        raise RecomputationMismatchError(
            f"phase (3) re-encoded {chunk} of {name} into token embeddings whose mask (shape "
            f"{tuple(recomputed.mask.shape)}) differs from the one phase (1) cached (shape "
            f"{tuple(cached.mask.shape)}): the encoder's second pass differs from its first. {_CAUSES} {_AFTER}"
        )
    return (recomputed.values.masked_fill(~recomputed.mask[..., None], 0),
            cached.values.masked_fill(~cached.mask[..., None], 0))


def _tolerance(dtype: torch.dtype, device_type: str, tf32: bool) -> float:
    if dtype == torch.float32 and device_type == "cuda" and tf32:
        return TF32_TOLERANCE
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def _forward_tolerance(embedding: torch.Tensor, autocast_state: AutocastState, tf32: bool) -> float:
    """The tolerance of the embedding's dtype, or of the autocast dtype on its device where autocast was on."""
    device_type = embedding.device.type
    tolerance = _tolerance(embedding.dtype, device_type, tf32)
    for kind, enabled, dtype in autocast_state.devices:
        if kind == device_type and enabled:
            tolerance = max(tolerance, _tolerance(dtype, device_type, tf32))
    return tolerance


def _finite_difference(new: torch.Tensor, old: torch.Tensor, name: str, chunk: str) -> tuple[float, float]:
    """The slow path, taken only when the fast comparison failed: NaN/inf on recomputation alone raises
    NonFiniteRecomputationError; entries non-finite in both passes must agree; the rest are compared."""
    finite = torch.isfinite(old)
    appeared = int((~torch.isfinite(new) & finite).sum())
    if appeared:
        raise NonFiniteRecomputationError(
            f"phase (3) re-encoded {chunk} of {name} and got {appeared} NaN/inf entries where phase (1) cached "
            f"finite ones: the second pass differs from the first. {_CAUSES} {_AFTER}"
        )
    if not torch.equal(new[~finite].nan_to_num(), old[~finite].nan_to_num()):
        return float("inf"), 0.0
    if not finite.any():
        return 0.0, 0.0
    return (new[finite] - old[finite]).abs().max().item(), old[finite].abs().max().item()
