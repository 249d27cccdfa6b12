"""The `.metadata` of a sharded checkpoint (`last.dcp`), read without running it.

torch.distributed.checkpoint writes `.metadata` with pickle and reads it back with `pickle.load`
(`FileSystemReader.read_metadata`), so a `.metadata` from elsewhere could run any code it carries, its sha256 in
extra.pt recomputed. `read_metadata` reads it with an unpickler that builds the classes torch writes there
(`METADATA_GLOBALS`: the metadata's dataclasses, `torch.Size`, dtypes, layouts, paths) and refuses any other name
before anything runs, then checks what the loader will use: every shard it names is a plain file of the folder.
`ScreenedReader` hands that object to `dcp.load` in place of a second read.
"""
from __future__ import annotations

import io
import pathlib
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader

from gradcache.train.checkpoints.state_bounds import bounds_fault
from gradcache.train.errors import CheckpointError

METADATA_FILE = ".metadata"
METADATA_GLOBALS: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "MetadataIndex",
        "StorageMeta", "TensorProperties", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _Unpickler(pickle.Unpickler):
    """pickle, with the names of `METADATA_GLOBALS` and torch's dtypes alone."""

    def find_class(self, module: str, name: str) -> Any:
        if name in METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not among the classes a sharded checkpoint's metadata holds")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id (no metadata holds one)")


def read_metadata(data: bytes, checkpoint: str, files: set[str]) -> dcp_metadata.Metadata:
    """The metadata pickled in `data` (the bytes of the checkpoint's `.metadata`), each shard file it names among
    `files` (the folder's).

    Raises:
        CheckpointError: it names anything else (code among it: refused before any ran), is damaged, names a shard
            outside `files`, or holds more than a checkpoint's metadata can.
    """
    try:
        metadata = _Unpickler(io.BytesIO(data)).load()
    except Exception as error:  # pickle raises many types for damaged bytes
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise CheckpointError(f"sharded checkpoint {checkpoint!r}: {METADATA_FILE} is not the metadata "
                              f"torch.distributed.checkpoint writes ({reason}); "
                              "the file was altered or not written by gradcache train. It was refused without running "
                              "any of it; resume from another checkpoint (previous.dcp) or start afresh") from None
    fault = _fault(metadata, files)
    if fault:
        raise CheckpointError(f"sharded checkpoint {checkpoint!r}: {METADATA_FILE} {fault}; gradcache train never "
                              "writes that, so the file was altered: resume from another checkpoint (previous.dcp) or "
                              "start afresh")
    return metadata


def _fault(metadata: Any, files: set[str]) -> str | None:
    if not isinstance(metadata, dcp_metadata.Metadata):
        return f"holds a {type(metadata).__name__}, not torch.distributed.checkpoint's Metadata"
    entries, storage = metadata.state_dict_metadata, metadata.storage_data
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        return "lacks its entries or their storage"
    fault = bounds_fault([list(entries.items()), list(storage.items())], 2)
    if fault:
        return f"holds {fault}"
    for where in storage.values():
        if not isinstance(where, dcp_filesystem._StorageInfo):
            return f"holds a {type(where).__name__} where a shard's place belongs"
        name = where.relative_path
        if not isinstance(name, str) or name not in files or "/" in name or name in (".", ".."):
            return f"names the shard {name!r}, which is not a file of the checkpoint"
        if not all(isinstance(n, int) and n >= 0 for n in (where.offset, where.length)):
            return f"places a shard at offset {where.offset!r}, length {where.length!r}"
    return None


class ScreenedReader(FileSystemReader):
    """A FileSystemReader of `path` whose metadata is `metadata`, read by `read_metadata` (never by pickle)."""

    def __init__(self, path: str | pathlib.Path, metadata: dcp_metadata.Metadata) -> None:
        super().__init__(str(path))
        self.screened = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        metadata = self.screened
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
