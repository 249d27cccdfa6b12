"""Which `--kind` trains from which format of `--model` folder, checked before the folder's modules are read, so that
a folder of another kind's own format is refused with the kind that reads it (UsageError, exit status 2) instead of
failing inside a loader that cannot apply its modules.

- A format that only its own kind trains from (`Text.trained_only_by_its_kind`: a MultiVectorEncoder folder, a
  projection of every token after its transformer) is refused by every other kind, naming the kind that reads it.
- A format a kind cannot train from (`Text.refused_formats`: a SparseEncoder folder for `--kind multi-vector`, which
  pools nothing) is refused with the kind's reason and the kind that reads it.

Any other pairing is left to the kind's own checks.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gradcache.train.errors import UsageError
from gradcache.train.model_folders import model_folder_format
from gradcache.train.modes.text_folders import text_model_folder

# how to make any folder of these formats a plain Hugging Face folder that every kind trains from
PLAIN_FOLDER = ("a copy of the folder without its modules.json (its config.json, weights and tokenizer files: "
                "the Hugging Face model alone)")


def check_folder_format(kind: Any, name: str, option: str, kinds: Iterable[Any]) -> None:
    """Refuse (UsageError naming `option`, the folder's format and the `--kind` that reads it) a folder `name` that
    the text kind `kind` cannot train from (module docstring), `kinds` being every text kind (`TEXT_KINDS`); a name
    that is no folder, or a folder no text kind reads, passes here for the kind's own checks to name."""
    folder = text_model_folder(name, option)
    if not folder.is_dir():
        return
    try:
        found = model_folder_format(folder)
    except UsageError:  # of no format model_folders.py knows: a kind may know it
        found = None
    reader = next((other for other in kinds if other.reads_folder(found, folder)), None)
    if reader is None or reader is kind:  # no text kind's folder, or its own
        return
    if reader.trained_only_by_its_kind:
        raise UsageError(f"{option} {name} is a {reader.folder_description}, which --kind {kind.kind} does not "
                         f"read; train it with --kind {reader.kind}, or give --kind {kind.kind} {PLAIN_FOLDER}")
    if found in kind.refused_formats:
        raise UsageError(f"{option} {name} is a {reader.folder_description}, which --kind {kind.kind} does not read "
                         f"({kind.refused_formats[found]}); train it with --kind {reader.kind}, or give --kind "
                         f"{kind.kind} {PLAIN_FOLDER}")
