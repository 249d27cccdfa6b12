"""What a sentence-transformers `MultiVectorEncoder` folder says about itself, for the layout a fresh
`MultiVectorEncoder` saves (and `--kind multi-vector` exports): Transformer -> token-level Dense (no bias, no
activation) -> MultiVectorMask -> Normalize, `config_sentence_transformers.json`'s `model_type`
"MultiVectorEncoder". The Transformer's query expansion of strategy "fixed" with the default token is read
(`QueryExpansion`); a mask with a skiplist or an allowlist, another expansion, per-task lengths or other modules
are refused (ValueError): `MultiVectorTextEncoder` computes the plain layout alone. Every size is checked
before anything of that size is built: the Dense's features against its weights' shape (read from the
safetensors header), the lengths against the model's positions (`read_multi_vector_folder`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gradcache.models.model_positions import check_tokens
from gradcache.models.query_expansion import QueryExpansion
from gradcache.models.safetensors_header import tensor_shapes
from gradcache.models.sentence_transformers_folder import (
    _inside,
    read_json_object,
    read_max_seq_length,
    read_modules,
    read_prompts,
    transformer_config,
)
from gradcache.ranges import is_int

MODEL_TYPE = "MultiVectorEncoder"
_KINDS = ("Transformer", "Dense", "MultiVectorMask", "Normalize")  # in this order


@dataclass(frozen=True)
class MultiVectorLayout:
    """model_path: the Hugging Face model's folder; dense_weights: the projection's safetensors (`linear.weight`,
    (D, hidden)); token_dim: D; hidden_size: the projection's in_features; max_seq_length: from `sentence_bert_config.json` (None when absent);
    query_prompt, passage_prompt: its prompts "query" and "document" (None when empty or absent);
    query_expansion: how its queries are expanded (None: not at all)."""

    model_path: Path
    dense_weights: Path
    token_dim: int
    max_seq_length: int | None
    query_prompt: str | None
    passage_prompt: str | None
    query_expansion: QueryExpansion | None = None
    hidden_size: int | None = None


def is_multi_vector_folder(path: str | os.PathLike) -> bool:
    """`path` holds `modules.json` and a `config_sentence_transformers.json` whose `model_type` is
    "MultiVectorEncoder"."""
    root = Path(path)
    settings = root / "config_sentence_transformers.json"
    if not (root / "modules.json").is_file() or not settings.is_file():
        return False
    try:
        return read_json_object(settings).get("model_type") == MODEL_TYPE
    except ValueError:
        return False


def read_multi_vector_folder(path: str | os.PathLike) -> MultiVectorLayout:
    """The layout of the `MultiVectorEncoder` folder `path` (module docstring), every value checked before anything
    is built from it: the Dense config's `in_features` and `out_features` whole numbers equal to the shape of the
    `linear.weight` its `model.safetensors` holds (read from the file's header alone: a config edited to 2e9
    features is refused before a (2e9, hidden) projection is allocated), `max_seq_length` and the query expansion's
    length within the model's positions (models/model_positions.py), every JSON file an object and every key of
    its type.

    Raises:
        ValueError: not such a folder, an unreadable file, modules other than the plain four, a module path outside
            the folder, a Dense with a bias or an activation, a mask with a skiplist or allowlist, per-task lengths,
            a query expansion other than strategy "fixed" with the default token; a value of the wrong type, out
            of its bounds, or not the weights' (the message names the file and the key).
    """
    root = Path(path)
    if not is_multi_vector_folder(root):
        raise ValueError(f"{root} is not a sentence-transformers MultiVectorEncoder folder (modules.json, and "
                         f"model_type {MODEL_TYPE!r} in config_sentence_transformers.json)")
    entries = read_modules(root)
    kinds = tuple(entry.get("type", "").rsplit(".", 1)[-1] for entry in entries)
    if kinds != _KINDS:
        raise ValueError(f"{root / 'modules.json'} lists {list(kinds)}; this program reads {list(_KINDS)} alone, "
                         "the modules a fresh MultiVectorEncoder saves")
    model_path, dense, mask, _ = (_inside(root, entry.get("path", "")) for entry in entries)
    token_dim, hidden_size = _dense_features(dense)
    mask_config = read_json_object(mask / "config.json")
    if mask_config.get("skiplist_words") or mask_config.get("keep_only_token_ids"):
        raise ValueError(f"{mask / 'config.json'}: a skiplist or an allowlist of tokens; this program scores every "
                         "real token")
    settings_path, transformer = transformer_config(model_path, root)
    for key in ("query_length", "document_length"):
        if transformer.get(key) is not None:
            raise ValueError(f"{settings_path}: {key} {transformer[key]}; this program reads a model without it "
                             "(one max_seq_length for queries and documents)")
    expansion = transformer.get("query_expansion")
    try:
        expansion = None if expansion is None else QueryExpansion.from_sentence_transformers(expansion)
    except ValueError as error:
        raise ValueError(f"{settings_path}: {error}") from error
    if expansion is not None:
        check_tokens(expansion.length, f"{settings_path}: query_expansion length", model_path)
    prompts = read_prompts(root)
    return MultiVectorLayout(model_path=model_path, dense_weights=dense / "model.safetensors", token_dim=token_dim,
                             max_seq_length=read_max_seq_length(settings_path, transformer, model_path),
                             query_prompt=prompts.get("query") or None, passage_prompt=prompts.get("document") or None,
                             query_expansion=expansion, hidden_size=hidden_size)


def _dense_features(dense: Path) -> tuple[int, int]:
    """The projection's (out_features, in_features), from the Dense module folder `dense`: its config.json without a bias or an
    activation, `in_features` and `out_features` whole numbers that are the (out, in) shape of the `linear.weight`
    in its `model.safetensors`, read from the file's header (ValueError naming the file and the key)."""
    path = dense / "config.json"
    config = read_json_object(path)
    bias, activation = config.get("bias", True), config.get("activation_function", "")
    if not isinstance(bias, bool) or not isinstance(activation, str):
        raise ValueError(f"{path}: bias {bias!r} and activation_function {activation!r} must be true or false and a "
                         "class name; this program reads a projection without either (bias false, Identity)")
    if bias or not activation.endswith("Identity"):
        raise ValueError(f"{path}: a Dense with a bias or an activation; this program reads a projection without "
                         "either (bias false, Identity)")
    weights = dense / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{dense} holds no model.safetensors, the projection's weights; export the model again")
    shape = tensor_shapes(weights).get("linear.weight")
    if shape is None or len(shape) != 2:
        raise ValueError(f"{weights} holds no linear.weight of two dimensions (out_features, in_features); export "
                         "the model again")
    for key, size in (("out_features", shape[0]), ("in_features", shape[1])):
        value = config.get(key)
        if not is_int(value) or value != size:
            raise ValueError(f"{path}: {key} {value!r} is not the {size} of the projection its weights hold "
                             f"({weights}: linear.weight of shape {tuple(shape)}); the folder was edited: set "
                             f"{key} to {size}, or export the model again")
    return shape[0], shape[1]
