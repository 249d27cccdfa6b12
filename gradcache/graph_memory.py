"""How many bytes a chunk's autograd graph holds, and which chunks phase (1) keeps within `memory_budget`.

A graph's size is counted as the bytes of the tensors autograd saves for backward while the chunk is encoded
(`torch.autograd.graph.saved_tensors_hooks`), each storage once per step (a view and its base are one storage; a
storage that a kept chunk's graph already holds is not counted again by the next), leaving out parameters, the
chunk's own inputs (alive anyway) and the low-precision copies autocast makes of trainable parameters: autocast
makes one copy per parameter for all the chunks of a step (its weight cache), and every step holds it at its peak
whether or not graphs are kept (phase (3) re-encodes under the same autocast), so a budget that holds every
chunk's float32 graph holds every chunk's bf16 one. A copy of a frozen parameter, which autocast makes anew in
each forward, is counted: each kept graph holds its own. It does not see temporaries freed during the forward,
nor allocator rounding; on CUDA the peak is thus slightly above the budget, and every step also holds one
chunk's graph at a time, as GradCache without a budget does.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from gradcache.inputs import tensors_of


class SavedBytes:
    """The bytes counted so far: `total`; `keys`: the storages they are, for the ledger to hold once."""

    def __init__(self, left_out: Iterable[torch.Tensor], held: set[tuple[str, int]] = frozenset()) -> None:
        self.total = 0
        self.keys: set[tuple[str, int]] = set()
        self._seen = {key for key in map(_storage_key, left_out) if key is not None} | set(held)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if base.is_leaf and base.requires_grad:  # a parameter (FSDP2's gathered ones too) or a view of one
            return tensor
        if _is_parameter_copy(base):  # autocast's cached copy of a trainable parameter: one per step, not chunk
            return tensor.detach()
        key = _storage_key(tensor)
        if key is None:  # a tensor subclass without one storage: count its own elements
            self.total += tensor.numel() * tensor.element_size()
        elif key not in self._seen:
            self._seen.add(key)
            self.keys.add(key)
            self.total += tensor.untyped_storage().nbytes()
        # Not the tensor itself: an output its own node saves (tanh's, softmax's) would then hold that node, a
        # cycle through C++ that no garbage collector sees, so a graph measured and dropped (a chunk over the
        # budget) would never be freed. A detached alias holds the same storage and nothing else.
        return tensor.detach()


def _is_parameter_copy(tensor: torch.Tensor) -> bool:
    """A cast of a trainable parameter (autocast's weight cache): made by one `_to_copy` whose input is a leaf that
    accumulates a gradient."""
    node = tensor.grad_fn
    return node is not None and node.name() == "ToCopyBackward0" and any(
        hasattr(parent, "variable") for parent, _ in node.next_functions if parent is not None)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    try:
        return (str(tensor.device), tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # DTensor shards and other subclasses
        return None


@contextlib.contextmanager
def saved_bytes(left_out: Iterable[torch.Tensor], held: set[tuple[str, int]] = frozenset()) -> Iterator[SavedBytes]:
    """Count the bytes autograd saves inside, each storage once, leaving out those of `left_out` and the storages
    `held` (`GraphBudget.held`: counted by a kept chunk already)."""
    counter = SavedBytes(left_out, held)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda tensor: tensor):
        yield counter


def _units(chunk: Any) -> int:
    """What a chunk's graph grows with: the elements of its largest tensor (rows, or rows x tokens)."""
    return max((t.numel() for t in tensors_of(chunk)), default=1) or 1


class GraphBudget:
    """Phase (1)'s ledger: each input keeps a prefix of its chunks, in input order, while their graphs fit; the
    outputs `reuse_outputs` keeps for the other chunks take what is left, chunk by chunk (`keeps`).

    While any budget is left, the first chunk of an input is encoded with a graph and measured; each later one
    is tried only when the bytes per element measured so far say it fits in what is left, and kept when its
    measured graph does.
    A chunk that does not fit ends its input's prefix (its graph is dropped; phase (3) re-encodes it).
    """

    def __init__(self, budget: int | None) -> None:
        self.left = budget
        self.held: set[tuple[str, int]] = set()  # the storages the kept graphs hold, each counted once
        self._per_unit: dict[int, float] = {}
        self._closed: set[int] = set()

    def worth_trying(self, index: int, chunk: Any) -> bool:
        if not self.left or index in self._closed:  # no budget, or none left: nothing is measured, nothing kept
            return False
        per_unit = self._per_unit.get(index)
        if per_unit is None or per_unit * _units(chunk) <= self.left:
            return True
        self.close(index)
        return False

    def close(self, index: int) -> None:
        self._closed.add(index)

    def keeps(self, nbytes: int) -> bool:
        """Whether `nbytes` kept for phase (3) beside the graphs (`reuse_outputs`' outputs of a chunk re-encoded
        there) fit in what is left; True, and counted, when they do. Without a budget everything is kept."""
        if self.left is None:
            return True
        if nbytes > self.left:
            return False
        self.left -= nbytes
        return True

    def settle(self, index: int, chunk: Any, graph: SavedBytes) -> bool:
        """Record a tried chunk's measured graph; True when it is kept (its storages then count as held)."""
        self._per_unit[index] = graph.total / _units(chunk)
        if self.left is not None and graph.total <= self.left:
            self.left -= graph.total
            self.held |= graph.keys
            return True
        self.close(index)
        return False
