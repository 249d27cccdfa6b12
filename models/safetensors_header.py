"""What a ``.safetensors`` file holds, read from its header alone: every tensor's name and shape, so a model folder's
config can be checked against its weights before a module of that config is built (a tampered ``config.json``
with huge sizes would otherwise allocate them first), and a corrupt file is refused naming it.

The format: 8 bytes, the header's length N (little-endian); N bytes of JSON, ``{name: {"dtype", "shape",
"data_offsets"}, "__metadata__": {...}}``; then the tensors' bytes.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from torch import nn

MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound on the header


def tensor_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in the safetensors file ``path``, by name; no tensor is read.

    Raises:
        ValueError: ``path`` is not a whole safetensors file (its header is cut short, too large, not JSON, or
            names a tensor beyond the file's end); the message names the file.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{path} is not a safetensors file (its header length {length} does not fit its "
                             f"{size} bytes); export or save the model again")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path} has a corrupt safetensors header ({error}); export or save the model "
                             "again") from error
    if not isinstance(header, dict):
        raise ValueError(f"{path} has a corrupt safetensors header (not a JSON object)")
    shapes, data = {}, size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if isinstance(entry, dict) else (None, None)
        if (not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape)
                or not isinstance(offsets, list) or len(offsets) != 2 or not 0 <= offsets[0] <= offsets[1] <= data):
            raise ValueError(f"{path} has a corrupt safetensors header (tensor {name!r}: shape {shape}, bytes "
                             f"{offsets} of {data}); export or save the model again")
        shapes[name] = tuple(shape)
    return shapes


def check_shapes(module: nn.Module, path: str | os.PathLike) -> None:
    """Raise ValueError naming ``path`` unless it holds exactly ``module``'s state, shape for shape. Build
    ``module`` on the meta device (``with torch.device("meta")``): its shapes cost no memory."""
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    found = tensor_shapes(path)
    differ = [f"{name}: {expected.get(name, 'none')} in the config, {found.get(name, 'none')} in the weights"
              for name in sorted(expected.keys() | found.keys()) if expected.get(name) != found.get(name)]
    if differ:
        raise ValueError(f"{path} does not hold the model its config.json describes ({len(differ)} tensors differ, "
                         f"e.g. {'; '.join(differ[:3])}); the folder was edited or mixed: export it again")
