"""Whether the tokenizer transformers built from a model folder is the one the folder holds, and the Rust panics of
the tokenizers library told from Python's errors.

transformers picks a tokenizer's class from `tokenizer_config.json`'s `tokenizer_class`, else from `config.json`'s
`model_type`, and that class may rebuild the tokenizer from the vocabulary it finds: a BERT tokenizer (a WordPiece
`tokenizer.json`) in a Qwen2 model's folder without a `tokenizer_class` becomes a Qwen2 tokenizer, a byte-level
BPE over BERT's vocabulary with Qwen2's EOS token added, which splits text into other tokens than the folder's
tokenizer does, and whose post-processor, once told to append that EOS after BERT's [CLS] $A [SEP] template, makes
the tokenizers library panic ("not yet implemented") at the first text. `check_tokenizer_model` refuses a
WordPiece tokenizer rebuilt so when it loads; `is_panic` recognises the panic (pyo3's PanicException derives from
BaseException, not Exception, so `except Exception` lets it through).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def is_panic(error: BaseException) -> bool:
    """`error` is a Rust panic raised through pyo3 (`pyo3_runtime.PanicException`), a tokenizer's internal failure
    rather than a Python error."""
    return type(error).__name__ == "PanicException"


def declared_model(folder: str | os.PathLike) -> str | None:
    """The tokenization model `folder`'s `tokenizer.json` declares ("WordPiece", "BPE", "Unigram", "WordLevel");
    None where there is no such file or it names none (it is read again, and refused, by transformers)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            model = json.load(handle).get("model")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    kind = model.get("type") if isinstance(model, dict) else None
    return kind if isinstance(kind, str) else None


# The declared models refused when rebuilt as another: WordPiece is BERT's family's alone, so a class that rebuilds
# it as BPE is another model's. A WordLevel tokenizer.json (tests' character tokenizers) that a decoder's class
# rebuilds as a BPE without merges is let through: it keeps every token of the vocabulary.
REFUSED_WHEN_REBUILT = ("WordPiece",)


def check_tokenizer_model(tokenizer: Any, folder: str | os.PathLike) -> None:
    """Refuse (ValueError naming the file, both tokenizers and the fix) a fast `tokenizer` that tokenises with
    another model than the WordPiece one `folder`'s `tokenizer.json` declares (`REFUSED_WHEN_REBUILT`):
    transformers built another model's tokenizer class over the folder's vocabulary (module docstring). A slow
    tokenizer, or a folder without `tokenizer.json`, passes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    declared = declared_model(folder)
    if backend is None or declared not in REFUSED_WHEN_REBUILT:
        return
    built = type(backend.model).__name__
    if built == declared:
        return
    model_type = _model_type(Path(folder))
    chosen = f"for config.json's model_type {model_type!r}" if model_type else "from tokenizer_config.json"
    raise ValueError(f"{Path(folder) / 'tokenizer.json'} holds a {declared} tokenizer, but transformers builds a "
                     f"{type(tokenizer).__name__} ({chosen}) that tokenises with {built}: the folder holds the "
                     "tokenizer of another model. Save the model's own tokenizer there "
                     "(tokenizer.save_pretrained(folder)), or name the tokenizer's class in tokenizer_config.json's "
                     "tokenizer_class")


def _model_type(folder: Path) -> str | None:
    try:
        values = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    kind = values.get("model_type") if isinstance(values, dict) else None
    return kind if isinstance(kind, str) else None
