"""The checksum a checkpoint carries: sha256 over its contents, so flipped bytes count as a bad checkpoint.

`content_sha256(state)` walks the checkpoint's dict in order and feeds every value to one sha256: a tensor as its
dtype, shape and raw bytes, a number, string or None as its type and text, a container as its type, length and
items. It is computed before `torch.save` and stored in the file under `CHECKSUM_KEY`; `torch.load` returns the
same values in the same order, so the load recomputes it and compares. A damaged byte in a tensor's data, in a
number or in a string changes it; a damaged byte in the file's structure makes `torch.load` itself fail.

`files_sha256(folder)` is the same for a folder of files (the shards of a sharded checkpoint): sha256 of each.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

CHECKSUM_KEY = "sha256"  # in a checkpoint dict: content_sha256 of everything else


def content_sha256(state: dict[str, Any]) -> str:
    """sha256 (hex) of every entry of `state` except `CHECKSUM_KEY`."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != CHECKSUM_KEY})
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__[0]}{len(value)}".encode())
        for item in value:
            _feed(digest, item)
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
