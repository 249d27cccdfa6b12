"""The fingerprint of a LoRA run's base model folder: a run trains an adapter on the base weights it found, and
its checkpoints hold the adapter alone, so a resume, `gradcache eval RUN` or `gradcache export RUN` rebuilds the
model from `--model` as it is then. A folder whose weights, tokenizer or module configs changed since (a newer
revision, another fine-tune saved over it, two token ids swapped in tokenizer.json) would load without an error
and give another model.

The fingerprint, recorded when the run starts (RunConfig.base_fingerprint), is a sha256 per file of the folder, at
any depth: whole for every `config.json`, every tokenizer file and every sentence-transformers module config
(`SETTINGS_FILES`); for the weight files (`*.safetensors`, `*.bin`, `*.pt`, `*.pth`) whole with `--fingerprint
full`, else (`sampled`, the default) a file up to 4 MiB whole and a larger one by its size and 64 blocks of
64 KiB spread evenly from its first byte to its last. A new revision or fine-tune changes every block of its
weights, so a sampled sum sees it while reading 4 MiB of a 5 GB shard; an edit between the blocks (a few
thousand weights of one layer) is not seen: `full` sees it, reading every byte of every weight file each time the
model is rebuilt (docs/training.md says when to choose it).

Runs of configuration version 17 recorded `config.json` and the weight files alone (method `weights`): those files
are compared, their tokenizer is not.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from gradcache.train.errors import UsageError

if TYPE_CHECKING:
    from gradcache.train.config import RunConfig

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# What says how the model reads text and what its modules do, hashed whole: the tokenizers transformers and
# sentence-transformers save, and sentence-transformers' own configs (a module folder's own is its config.json).
SETTINGS_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
                  "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "modules.json",
                  "config_sentence_transformers.json", "sentence_bert_config.json", "preprocessor_config.json",
                  "processor_config.json")
METHODS = ("sampled", "full")  # --fingerprint; "weights": what runs of version 17 recorded
BLOCKS, BLOCK_BYTES = 64, 64 * 1024
READ_BYTES = 2**20  # a whole file is hashed a MiB at a time

__all__ = ["METHODS", "fingerprint", "check_fingerprint", "with_base_fingerprint"]


def fingerprint(folder: str | Path, method: str = "sampled") -> dict[str, str]:
    """{path relative to `folder`: sha256} of the folder's config.json, settings and weight files at any depth,
    the weight files hashed as `method` says ("sampled", "full"; "weights": config.json and weights alone)."""
    folder = Path(folder)

    def covered(path: Path) -> bool:
        return path.name == "config.json" or path.suffix in WEIGHT_SUFFIXES or (
            method != "weights" and path.name in SETTINGS_FILES)

    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                   p.relative_to(folder).parts) and covered(p))
    return {p.relative_to(folder).as_posix(): _digest(p, whole=method == "full" or p.suffix not in WEIGHT_SUFFIXES)
            for p in files}


def _digest(path: Path, whole: bool) -> str:
    size = path.stat().st_size
    sha = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        if whole or size <= BLOCKS * BLOCK_BYTES:
            while block := handle.read(READ_BYTES):
                sha.update(block)
        else:
            for index in range(BLOCKS):  # offsets 0 .. size - BLOCK_BYTES, evenly
                handle.seek(index * (size - BLOCK_BYTES) // (BLOCKS - 1))
                sha.update(handle.read(BLOCK_BYTES))
    return sha.hexdigest()


def check_fingerprint(recorded: dict[str, str], folder: str | Path, option: str, method: str = "sampled") -> None:
    """Raise UsageError unless `folder` has the fingerprint `recorded` (by `method`) when its run started, naming
    the files that differ, appeared or went missing, and the folder."""
    now = fingerprint(folder, method)
    changed = sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name))
    if not changed:
        return
    what = ", ".join(f"{name} ({'missing' if name not in now else 'new' if name not in recorded else 'changed'})"
                     for name in changed[:5])
    raise UsageError(f"{option} {folder}: not the base model this LoRA run started from: {what} since the run "
                     "recorded the folder's fingerprint, so its adapter would sit on other weights. Put the run's "
                     "base model back at that path (the run's --model), or train a new run on this one")


def with_base_fingerprint(config: RunConfig, folder: str | Path, option: str = "--model") -> RunConfig:
    """A LoRA run's options with the fingerprint of its base `folder`: recorded when the run starts (or first
    resumes from before fingerprints were recorded), else compared with the recorded one (`check_fingerprint`)."""
    if config.base_fingerprint is None:
        method = "sampled" if config.fingerprint == "weights" else config.fingerprint
        return dataclasses.replace(config, fingerprint=method, base_fingerprint=fingerprint(folder, method))
    check_fingerprint(config.base_fingerprint, folder, option, config.fingerprint)
    return config
