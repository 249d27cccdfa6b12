"""Raw (N_k, D) embeddings read as one stacked matrix of unit rows, a block of rows at a time, and the way back.

    u_i = x_i / max(||x_i||, eps),   dL/dx_i = (g_i - [||x_i|| >= eps] u_i (u_i . g_i)) / max(||x_i||, eps)

with eps = 1e-12 and g_i = dL/du_i: ``F.normalize``'s formula and its derivative. The tiled losses normalise
inside their autograd functions through this class, so neither the (N, D) unit rows nor their gradient exists
beside the inputs and the inputs' own gradients: a block of unit rows is formed when a tile needs it (one
division per element, ~1/tile of the matmul that follows), gradients with respect to the unit rows accumulate
straight into the buffers that become ``x.grad``, and ``to_input_gradients`` turns them into dL/dx in place.
Each unit row is the same division of the same norm as ``F.normalize`` performs, so it is bit-identical to the
dense losses' unit rows.

Several inputs stack into one matrix (NT-Xent's two views, InfoNCE's positives and hard negatives); a block
that straddles two of them is the only place their rows are copied together, (block, D) at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["NORM_EPS", "UnitBlocks", "distinct_inputs", "spans", "to_input_gradients"]

NORM_EPS = 1e-12  # F.normalize's default: rows shorter than this are divided by it instead


def spans(count: int, size: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive blocks of ``size`` covering range(count); the last one may be shorter."""
    return [(start, min(start + size, count)) for start in range(0, count, size)]


class UnitBlocks:
    """Rows ``tensors[parts[0]]``, then ``tensors[parts[1]]``, ... as one (sum N_k, D) matrix of unit rows.

    Args:
        tensors: the distinct raw inputs, each (N_k, D) in the compute dtype; a tensor used twice (as rows and
            as columns) appears once, so its gradient has one buffer.
        parts: indices into ``tensors``, in stacking order.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], parts: Sequence[int]) -> None:
        self.tensors = tensors
        self.parts = tuple(parts)
        self.offsets = [0]
        for index in self.parts:
            self.offsets.append(self.offsets[-1] + tensors[index].shape[0])
        self.count = self.offsets[-1]
        raw = {index: torch.linalg.vector_norm(tensors[index], dim=1, keepdim=True) for index in set(self.parts)}
        self.norms = {index: norm.clamp_min(NORM_EPS) for index, norm in raw.items()}  # (N_k, 1)

    def _pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(tensor index, first row, end row) of each input that rows start..stop of the stack touch."""
        pieces = []
        for position, index in enumerate(self.parts):
            low, high = max(start, self.offsets[position]), min(stop, self.offsets[position + 1])
            if low < high:
                pieces.append((index, low - self.offsets[position], high - self.offsets[position]))
        return pieces

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Unit rows start..stop of the stack: (stop - start, D)."""
        pieces = [self.tensors[index][low:high] / self.norms[index][low:high]
                  for index, low, high in self._pieces(start, stop)]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def add(self, grads: Sequence[torch.Tensor | None], start: int, stop: int, value: torch.Tensor) -> None:
        """grads[rows start..stop] += value, (stop - start, D), split across the inputs it spans."""
        offset = 0
        for index, low, high in self._pieces(start, stop):
            if grads[index] is not None:
                grads[index][low:high] += value[offset:offset + high - low]
            offset += high - low

    def add_product(self, grads: Sequence[torch.Tensor | None], start: int, stop: int,
                    left: torch.Tensor, right: torch.Tensor) -> None:
        """grads[rows start..stop] += left @ right, without forming the product apart from the buffer."""
        offset = 0
        for index, low, high in self._pieces(start, stop):
            if grads[index] is not None:
                grads[index][low:high].addmm_(left[offset:offset + high - low], right)
            offset += high - low


def distinct_inputs(*groups: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
    """The distinct tensors of ``groups`` (by identity) and each group as indices into them."""
    distinct: list[torch.Tensor] = []
    indices = []
    for group in groups:
        positions = []
        for tensor in group:
            found = next((k for k, seen in enumerate(distinct) if seen is tensor), None)
            if found is None:
                distinct.append(tensor)
                found = len(distinct) - 1
            positions.append(found)
        indices.append(tuple(positions))
    return distinct, indices


def to_input_gradients(tensors: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None], block_rows: int) -> None:
    """Turn each dL/du buffer into dL/dx of its raw input in place, ``block_rows`` rows at a time."""
    for tensor, grad in zip(tensors, grads):
        if grad is None:
            continue
        for start in range(0, tensor.shape[0], block_rows):
            stop = min(start + block_rows, tensor.shape[0])
            raw = torch.linalg.vector_norm(tensor[start:stop], dim=1, keepdim=True)  # (t, 1)
            norms = raw.clamp_min(NORM_EPS)
            unit = tensor[start:stop] / norms  # (t, D)
            g = grad[start:stop]
            # The clamp passes no gradient to the norm of a row shorter than eps: such a row gets g / eps.
            along = (unit * g).sum(dim=1, keepdim=True).mul_(raw >= NORM_EPS)  # (t, 1)
            g.sub_(unit.mul_(along)).div_(norms)
