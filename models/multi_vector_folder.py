"""What a sentence-transformers `MultiVectorEncoder` folder says about itself, for the layout a fresh
`MultiVectorEncoder` saves (and `--kind multi-vector` exports): Transformer -> token-level Dense (no bias, no
activation) -> MultiVectorMask -> Normalize, `config_sentence_transformers.json`'s `model_type`
"MultiVectorEncoder". The Transformer's query expansion of strategy "fixed" with the default token is read
(`QueryExpansion`); a mask with a skiplist or an allowlist, another expansion, per-task lengths or other modules
are refused (ValueError): `MultiVectorTextEncoder` computes the plain layout alone.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gradcache.models.query_expansion import QueryExpansion

MODEL_TYPE = "MultiVectorEncoder"
_KINDS = ("Transformer", "Dense", "MultiVectorMask", "Normalize")  # in this order


@dataclass(frozen=True)
class MultiVectorLayout:
    """model_path: the Hugging Face model's folder; dense_weights: the projection's safetensors (`linear.weight`,
    (D, hidden)); token_dim: D; max_seq_length: from `sentence_bert_config.json` (None when absent);
    query_prompt, passage_prompt: its prompts "query" and "document" (None when empty or absent);
    query_expansion: how its queries are expanded (None: not at all)."""

    model_path: Path
    dense_weights: Path
    token_dim: int
    max_seq_length: int | None
    query_prompt: str | None
    passage_prompt: str | None
    query_expansion: QueryExpansion | None = None


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(value, (dict, list)):
        raise ValueError(f"{path} holds a {type(value).__name__}, not a JSON object")
    return value


def is_multi_vector_folder(path: str | os.PathLike) -> bool:
    """`path` holds `modules.json` and a `config_sentence_transformers.json` whose `model_type` is
    "MultiVectorEncoder"."""
    root = Path(path)
    settings = root / "config_sentence_transformers.json"
    if not (root / "modules.json").is_file() or not settings.is_file():
        return False
    try:
        return _read_json(settings).get("model_type") == MODEL_TYPE
    except (ValueError, AttributeError):
        return False


def read_multi_vector_folder(path: str | os.PathLike) -> MultiVectorLayout:
    """The layout of the `MultiVectorEncoder` folder `path` (module docstring).

    Raises:
        ValueError: not such a folder, an unreadable file, modules other than the plain four, a module path outside
            the folder, a Dense with a bias or an activation, a mask with a skiplist or allowlist, per-task lengths,
            a query expansion other than strategy "fixed" with the default token.
    """
    from gradcache.models.sentence_transformers_folder import _inside

    root = Path(path)
    if not is_multi_vector_folder(root):
        raise ValueError(f"{root} is not a sentence-transformers MultiVectorEncoder folder (modules.json, and "
                         f"model_type {MODEL_TYPE!r} in config_sentence_transformers.json)")
    entries = sorted(_read_json(root / "modules.json"), key=lambda item: item.get("idx", 0))
    kinds = tuple(str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in entries)
    if kinds != _KINDS:
        raise ValueError(f"{root / 'modules.json'} lists {list(kinds)}; this program reads {list(_KINDS)} alone, "
                         "the modules a fresh MultiVectorEncoder saves")
    model_path, dense, mask, _ = (_inside(root, entry.get("path", "")) for entry in entries)
    dense_config = _read_json(dense / "config.json")
    if dense_config.get("bias", True) or not str(dense_config.get("activation_function", "")).endswith("Identity"):
        raise ValueError(f"{dense / 'config.json'}: a Dense with a bias or an activation; this program reads a "
                         "projection without either (bias false, Identity)")
    mask_config = _read_json(mask / "config.json")
    if mask_config.get("skiplist_words") or mask_config.get("keep_only_token_ids"):
        raise ValueError(f"{mask / 'config.json'}: a skiplist or an allowlist of tokens; this program scores every "
                         "real token")
    transformer = {}
    for settings in (model_path / "sentence_bert_config.json", root / "sentence_bert_config.json"):
        if settings.is_file():
            transformer = _read_json(settings)
            break
    for key in ("query_length", "document_length"):
        if transformer.get(key) is not None:
            raise ValueError(f"{root}: {key} {transformer[key]}; this program reads a model without it (one "
                             "max_seq_length for queries and documents)")
    expansion = transformer.get("query_expansion")
    try:
        expansion = None if expansion is None else QueryExpansion.from_sentence_transformers(expansion)
    except ValueError as error:
        raise ValueError(f"{root}: {error}") from error
    prompts = _read_json(root / "config_sentence_transformers.json").get("prompts") or {}
    return MultiVectorLayout(model_path=model_path, dense_weights=dense / "model.safetensors",
                             token_dim=int(dense_config["out_features"]),
                             max_seq_length=transformer.get("max_seq_length"),
                             query_prompt=prompts.get("query") or None, passage_prompt=prompts.get("document") or None,
                             query_expansion=expansion)
