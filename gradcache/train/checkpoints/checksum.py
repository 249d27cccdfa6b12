"""The checksum a checkpoint carries: sha256 over its contents, so flipped bytes count as a bad checkpoint.

`content_sha256(state)` walks the checkpoint's dict in order and feeds every value to one sha256. It is computed
before `torch.save` and stored in the file under `CHECKSUM_KEY`, its method's version under `VERSION_KEY`;
`torch.load` returns the same values in the same order, and the same sharing of objects (a pickle writes an object
once and refers to it after), so the load recomputes it and compares. A damaged byte in a tensor's data, in a
number or in a string changes it; a damaged byte in the file's structure makes `torch.load` itself fail.

Version 2 (`CHECKSUM_VERSION`, written since the hostile-input pass of issue 49) visits each object once: a
container, string or tensor reached again feeds a reference to its first visit, and a tensor feeds its storage's
bytes once (however many views share it) with its dtype, shape, strides and offset, never a contiguous copy. So
its work is the file's size, whatever its objects' sharing unfolds to. Version 1 (files without `VERSION_KEY`)
fed a tensor as its dtype, shape and contiguous bytes, and a shared object each time it was reached; such files
still load, after `state_bounds.bounds_fault` has bounded what that walk costs. A container is fed as its type,
length and entries, a number, string or None as its type and text, in both.

`files_sha256(folder)` is the same for a folder of files (the shards of a sharded checkpoint): sha256 of each.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from gradcache.train.checkpoints.state_bounds import children, is_container, storage_key

CHECKSUM_KEY = "sha256"  # in a checkpoint dict: content_sha256 of everything else
VERSION_KEY = "sha256_version"  # beside it: the method's version (absent: 1)
CHECKSUM_VERSION = 2  # what a save writes


def content_sha256(state: dict[str, Any], version: int = CHECKSUM_VERSION) -> str:
    """sha256 (hex) of every entry of `state` but `CHECKSUM_KEY` and `VERSION_KEY`, by the method `version`.
    Call it on a state that `state_bounds.bounds_fault` passed (a save's own state does): it walks containers by
    recursion, at most `MAX_DEPTH` deep then."""
    digest = hashlib.sha256()
    content = {k: v for k, v in state.items() if k not in (CHECKSUM_KEY, VERSION_KEY)}
    if version == 1:
        _feed_v1(digest, content)
    elif version == 2:
        _Feed(digest).value(content)
    else:
        raise ValueError(f"checksum version {version!r}: this program knows 1 and {CHECKSUM_VERSION}")
    return digest.hexdigest()


class _Feed:
    """Version 2: each object fed once; one reached again is fed as `R<n>`, the n-th object first fed."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.seen: dict[int, int] = {}  # id -> its number
        self.storages: dict[tuple[str, int], int] = {}

    def value(self, value: Any) -> None:
        shared = is_container(value) or isinstance(value, (torch.Tensor, str, bytes, bytearray))
        if shared:
            if id(value) in self.seen:
                self.digest.update(b"R%d;" % self.seen[id(value)])
                return
            self.seen[id(value)] = len(self.seen)
        if isinstance(value, torch.Tensor):
            self._tensor(value)
        elif is_container(value):
            kind = "D" if isinstance(value, dict) else type(value).__name__[0]
            self.digest.update(f"{kind}{len(value)};".encode())
            for entry in children(value):
                self.value(entry)
        elif isinstance(value, str):
            text = value.encode("utf-8", "surrogatepass")
            self.digest.update(b"s%d:" % len(text) + text)
        elif isinstance(value, (bytes, bytearray)):
            self.digest.update(b"B%d:" % len(value) + bytes(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            self.digest.update(b"i%x;" % value if value >= 0 else b"i-%x;" % -value)  # any length, linear time
        else:  # float, bool, None and the few other plain values weights_only loads (torch.Size, dtype)
            text = repr(value).encode()
            self.digest.update(f"{type(value).__name__}{len(text)}:".encode() + text)

    def _tensor(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        self.digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}{tensor.stride()}@{tensor.storage_offset()}"
                           .encode())
        key = storage_key(tensor)
        if key is None:
            self.digest.update(b"S;")
        elif key in self.storages:
            self.digest.update(b"S%d;" % self.storages[key])
        else:
            self.storages[key] = len(self.storages)
            storage = tensor.untyped_storage()
            if storage.device.type != "cpu":
                storage = storage.cpu()
            data = torch.empty(0, dtype=torch.uint8).set_(storage)  # the storage's bytes, not a copy
            self.digest.update(b"S%d:" % storage.nbytes())
            self.digest.update(memoryview(data.numpy()))


def _feed_v1(digest: Any, value: Any) -> None:
    """Version 1, as it was written (a shared object fed each time it is reached)."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key, item in value.items():
            _feed_v1(digest, key)
            _feed_v1(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__[0]}{len(value)}".encode())
        for item in value:
            _feed_v1(digest, item)
    elif isinstance(value, (bytes, bytearray)):
        digest.update(b"B%d" % len(value) + bytes(value))
    else:  # str, int, float, bool, None and the few other plain values weights_only loads (torch.Size, dtype)
        text = repr(value).encode()
        digest.update(f"{type(value).__name__}{len(text)}:".encode() + text)


def files_sha256(folder: str | os.PathLike, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 (hex) of each file directly in `folder`, by name, except those named in `exclude`."""
    found = {}
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.name not in exclude:
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            found[path.name] = digest.hexdigest()
    return found
