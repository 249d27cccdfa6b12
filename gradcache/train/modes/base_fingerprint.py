"""The fingerprint of a LoRA run's base model folder: a run trains an adapter on the base weights it found, and
its checkpoints hold the adapter alone, so a resume, `gradcache eval RUN` or `gradcache export RUN` rebuilds the
model from `--model` as it is then. A folder whose weights changed since (same shapes, other values: a newer
revision, another fine-tune saved over it) would load without an error and give another model.

The fingerprint, recorded when the run starts (RunConfig.base_fingerprint), is a sha256 per file of the folder's
`config.json` files (whole) and its weight files (`*.safetensors`, `*.bin`, `*.pt`, `*.pth`): a file up to 4 MiB
whole, a larger one by its size and 64 blocks of 64 KiB spread evenly from its first byte to its last. A new
revision or fine-tune changes every block of its weights, so a sampled sum sees it while reading 4 MiB of a 5 GB
shard; an edit of a few bytes between the blocks is not seen (the checkpoints' own sha256 guard against damage).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from gradcache.train.errors import UsageError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
BLOCKS, BLOCK_BYTES = 64, 64 * 1024

__all__ = ["fingerprint", "check_fingerprint"]


def fingerprint(folder: str | Path) -> dict[str, str]:
    """{path relative to `folder`: sha256} of the folder's config.json and weight files, at any depth."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                   p.relative_to(folder).parts) and (p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES))
    return {p.relative_to(folder).as_posix(): _digest(p, whole=p.suffix not in WEIGHT_SUFFIXES) for p in files}


def _digest(path: Path, whole: bool) -> str:
    size = path.stat().st_size
    sha = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        if whole or size <= BLOCKS * BLOCK_BYTES:
            sha.update(handle.read())
        else:
            for index in range(BLOCKS):  # offsets 0 .. size - BLOCK_BYTES, evenly
                handle.seek(index * (size - BLOCK_BYTES) // (BLOCKS - 1))
                sha.update(handle.read(BLOCK_BYTES))
    return sha.hexdigest()


def check_fingerprint(recorded: dict[str, str], folder: str | Path, option: str) -> None:
    """Raise UsageError unless `folder` has the fingerprint `recorded` when its run started, naming the files
    that differ, appeared or went missing, and the folder."""
    now = fingerprint(folder)
    changed = sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name))
    if not changed:
        return
    what = ", ".join(f"{name} ({'missing' if name not in now else 'new' if name not in recorded else 'changed'})"
                     for name in changed[:5])
    raise UsageError(f"{option} {folder}: not the base model this LoRA run started from: {what} since the run "
                     "recorded the folder's fingerprint, so its adapter would sit on other weights. Put the run's "
                     "base model back at that path (the run's --model), or train a new run on this one")
