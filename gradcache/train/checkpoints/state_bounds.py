"""What a loaded checkpoint can hold: a state dict is a shallow tree of tensors, numbers and strings, so an object
graph that is not one is refused before anything walks it (its checksum included).

A pickle shares an object wherever it is referenced again (its memo), so a few hundred bytes can hold `[a, a]`
nested 64 times (2**64 leaves to a walk that follows every reference), a list holding itself (endless), a list
nested 100,000 deep, or a tensor whose shape and strides reach 4 TiB over a 4-byte storage. `bounds_fault` measures
the graph once, each object once (shared references by their id), and names the first fault it meets:

- a container that holds itself (a cycle: a state dict never does);
- nesting deeper than `MAX_DEPTH` (a checkpoint's deepest entry, a rank's Python random state, is 7 deep);
- more than `MAX_ITEMS` entries in the tree the graph unfolds to, each shared reference counted every time it is
  reached (what any walk that does not remember its visits costs); a checkpoint holds a few entries per tensor;
- a tensor view that reaches past its storage (torch refuses to build one; checked here again);
- for the checksum of version 1 (`checksum.py`), which copies each view contiguous: a view larger than its
  storage (an expanded, stride-0 view), or views over one storage adding up to more than `V1_COPIES` times the
  checkpoint's storages (the copies that checksum would make).

Each bound is checked as the walk reaches it, so the work done before a refusal is at most the bound.
"""
from __future__ import annotations

from typing import Any

import torch

MAX_DEPTH = 32  # containers within containers
MAX_ITEMS = 10_000_000  # entries of the unfolded tree
V1_COPIES = 2  # version-1 checksums: bytes copied, over the bytes of the distinct storages (tied weights: 2)
V1_SLACK = 2**30  # ... plus this many bytes


def bounds_fault(state: Any, checksum_version: int) -> str | None:
    """What makes `state` more than a state dict can be (see the module docstring), in words; None: nothing."""
    return _Measure(checksum_version).fault(state)


def view_fault(tensor: torch.Tensor) -> str | None:
    """Where `tensor`'s shape, strides and offset reach past its storage (in words); None: within it."""
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    if any(stride < 0 for stride in tensor.stride()):
        return f"a tensor with a negative stride {tuple(tensor.stride())}"
    last = tensor.storage_offset() + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    reach, held = (last + 1) * tensor.element_size(), tensor.untyped_storage().nbytes()
    if reach > held:
        return (f"a tensor of shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())} and offset "
                f"{tensor.storage_offset()} that reaches {reach} bytes into a storage of {held}")
    return None


def storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    """What tells `tensor`'s storage from another's (None: it has no bytes to tell)."""
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta" or storage.nbytes() == 0:
        return None
    return str(tensor.device), storage.data_ptr()


def is_container(value: Any) -> bool:
    """Walked into by the checks and the checksum: dicts, lists and tuples (their subclasses too)."""
    return isinstance(value, (dict, list, tuple))


def children(value: Any) -> list[Any]:
    """A container's entries, a dict's keys and values alternating (the checksum's order)."""
    if isinstance(value, dict):
        return [part for item in value.items() for part in item]
    return list(value)


class _Measure:
    """One walk: each container's unfolded size (and the bytes a version-1 checksum copies in it), kept by id, so a
    shared container is measured once and counted wherever it is referenced."""

    def __init__(self, checksum_version: int) -> None:
        self.version = checksum_version
        self.done: dict[int, tuple[int, int]] = {}  # id -> (items of its unfolded tree, bytes version 1 copies)
        self.storages: dict[tuple[str, int], int] = {}  # storage -> its bytes

    def fault(self, state: Any) -> str | None:
        try:
            _, copied = self._walk(state)
        except _Refused as refused:
            return str(refused)
        held = sum(self.storages.values())
        if self.version == 1 and copied > V1_COPIES * held + V1_SLACK:
            return f"tensor views adding up to {copied} bytes over {held} bytes of storage (its checksum copies each)"
        return None

    def _leaf(self, value: Any) -> tuple[int, int]:
        """(1, the bytes a version-1 checksum copies of it)."""
        if not isinstance(value, torch.Tensor):
            return 1, 0
        fault = view_fault(value)
        if fault:
            raise _Refused(fault)
        key = storage_key(value)
        if key is not None:
            self.storages[key] = value.untyped_storage().nbytes()
        size = value.numel() * value.element_size()
        if self.version == 1 and key is not None and size > value.untyped_storage().nbytes():
            raise _Refused(f"an expanded tensor of shape {tuple(value.shape)} over a storage of "
                           f"{value.untyped_storage().nbytes()} bytes (its checksum would copy {size} bytes)")
        return 1, size

    def _walk(self, root: Any) -> tuple[int, int]:
        """Depth-first over `root`; a frame is [container, its entries, next entry, items, copied bytes]."""
        if not is_container(root):
            return self._leaf(root)
        frames = [[root, children(root), 0, 1, 0]]
        open_ids = {id(root)}
        while True:
            frame = frames[-1]
            container, entries, index = frame[:3]
            if index == len(entries):
                frames.pop()
                open_ids.discard(id(container))
                self.done[id(container)] = measured = (frame[3], frame[4])
                if not frames:
                    return measured
                self._add(frames[-1], measured)
                continue
            frame[2] += 1
            entry = entries[index]
            if not is_container(entry):
                self._add(frame, self._leaf(entry))
            elif id(entry) in open_ids:
                raise _Refused(f"a {type(entry).__name__} that holds itself")
            elif id(entry) in self.done:
                self._add(frame, self.done[id(entry)])
            elif len(frames) >= MAX_DEPTH:
                raise _Refused(f"containers nested more than {MAX_DEPTH} deep")
            else:
                frames.append([entry, children(entry), 0, 1, 0])
                open_ids.add(id(entry))

    @staticmethod
    def _add(frame: list[Any], measured: tuple[int, int]) -> None:
        frame[3] += measured[0]
        frame[4] += measured[1]
        if frame[3] > MAX_ITEMS:
            raise _Refused(f"more than {MAX_ITEMS:,} entries when each shared one is counted where it is "
                           "referenced")


class _Refused(Exception):
    """A bound reached; its text says which."""
