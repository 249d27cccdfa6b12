"""Which `--kind` trains from which kind of `--model` folder, checked before the folder's modules are read, so that
a folder of another kind is refused with the kind that reads it (UsageError, exit status 2) instead of failing
inside a loader that cannot apply its modules.

- A sentence-transformers MultiVectorEncoder folder (a `--kind multi-vector` export: a token-level Dense
  projection after its transformer) is read by `--kind multi-vector` alone.
- A SparseEncoder folder (SPLADE pooling) is not read by `--kind multi-vector`, which pools nothing: `--pooling`
  does not apply there, so the advice is `--kind sparse`, or the folder's Hugging Face model alone.

Any other pairing is left to the kind's own checks.
"""
from __future__ import annotations

from gradcache.train.errors import UsageError
from gradcache.train.model_folders import ModelFolderFormat, model_folder_format
from gradcache.train.modes.text_folders import text_model_folder

MULTI_VECTOR = "multi-vector"
# how to make any folder of these kinds a plain Hugging Face folder that every kind trains from
PLAIN_FOLDER = ("a copy of the folder without its modules.json (its config.json, weights and tokenizer files: "
                "the Hugging Face model alone)")


def check_folder_kind(kind: str, name: str, option: str = "--model") -> None:
    """Refuse (UsageError naming `option`, the folder's kind and the `--kind` that reads it) a folder `name` that
    `--kind kind` cannot train from (module docstring); a name that is no folder, or a folder of no known kind,
    passes here for the kind's own checks to name."""
    folder = text_model_folder(name, option)
    if not folder.is_dir():
        return
    try:
        found = model_folder_format(folder)
    except UsageError:
        return
    if found == ModelFolderFormat.MULTI_VECTOR and kind != MULTI_VECTOR:
        raise UsageError(f"{option} {name} is a multi-vector folder (a sentence-transformers MultiVectorEncoder: a "
                         f"projection of every token after its transformer), which --kind {kind} does not read; "
                         f"train it with --kind multi-vector, or give --kind {kind} {PLAIN_FOLDER}")
    if found == ModelFolderFormat.SPARSE_ENCODER and kind == MULTI_VECTOR:
        raise UsageError(f"{option} {name} is a SparseEncoder folder (SPLADE pooling), which --kind multi-vector does "
                         "not read (it pools nothing, so --pooling does not apply to it); train it with --kind "
                         f"sparse, or give --kind multi-vector {PLAIN_FOLDER}")
