"""What a sentence-transformers model folder says about itself: where its transformer lives, how it pools, whether
it normalises.

A folder saved by sentence-transformers holds ``modules.json``, the list of modules applied in order: a
``Transformer`` (the Hugging Face model, usually in the folder itself), a ``Pooling`` module whose
``config.json`` names the pooling (``"pooling_mode": "mean"``, or the older ``"pooling_mode_mean_tokens": true``),
and optionally a ``Normalize`` module (L2 normalisation, no files). all-MiniLM-L6-v2 is exactly that:
Transformer, mean Pooling, Normalize. ``sentence_bert_config.json`` gives the ``max_seq_length`` it was trained with.
The Pooling config's ``include_prompt`` (default true) says whether mean pooling counts a prompt's tokens, and
``config_sentence_transformers.json``'s ``prompts`` name the texts prepended by ``encode(..., prompt_name=...)``:
``"query"`` for queries, ``"document"`` (else ``"passage"``, else ``"corpus"``, the keys sentence-transformers'
``encode_document`` tries in this order) for passages.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# The older boolean keys, mapped to the newer "pooling_mode" names, in sentence-transformers' order.
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_OUR_NAMES = {"lasttoken": "last"}  # sentence-transformers' mode names that HuggingFaceEncoder spells otherwise


@dataclass(frozen=True)
class SentenceTransformerLayout:
    """The parts of a sentence-transformers folder that decide its embedding.

    Args:
        model_path: the folder of the Hugging Face model (the ``Transformer`` module's path).
        pooling: the ``Pooling`` module's mode (``"mean"``, ``"cls"``, ``"max"`` ..., ``"last"`` for
            ``lasttoken``; several joined by ``"+"`` when it concatenates them); ``"splade"`` for a
            ``SpladePooling`` module (a SparseEncoder folder); None when the folder has none.
        normalize: True when a ``Normalize`` module follows the pooling.
        max_seq_length: from ``sentence_bert_config.json``; None when absent.
        include_prompt: the Pooling config's ``include_prompt`` (True when absent).
        query_prompt, passage_prompt: the ``prompts`` of ``config_sentence_transformers.json`` for queries and
            passages (module docstring); None when it has none.
    """

    model_path: Path
    pooling: str | None
    normalize: bool
    max_seq_length: int | None
    include_prompt: bool = True
    query_prompt: str | None = None
    passage_prompt: str | None = None


QUERY_PROMPT_NAME = "query"
SPLADE_POOLING = "splade"  # `pooling` of a SparseEncoder folder: max over tokens of log(1 + relu(MLM logits))
PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus")  # sentence-transformers' encode_document's order


def _module_kind(entry: dict) -> str:
    # "sentence_transformers.models.Pooling" and newer module paths alike end in the class name.
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error


def _pooling_mode(config: dict) -> str:
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [name for key, name in _LEGACY_KEYS.items() if config.get(key, False)] or ["mean"]
    return "+".join(_OUR_NAMES.get(mode, mode) for mode in modes)


def _inside(root: Path, module_path: str) -> Path:
    """`root / module_path`, refused (ValueError naming it) where it leaves `root`: a path of modules.json loads
    a module from the folder it describes, never from elsewhere (`..`, an absolute path)."""
    if not isinstance(module_path, str):
        raise ValueError(f"{root / 'modules.json'} gives a module path {module_path!r}; a path is a string")
    joined = Path(os.path.normpath(root / module_path))
    if not Path(os.path.abspath(joined)).is_relative_to(os.path.abspath(root)):
        raise ValueError(f"{root / 'modules.json'} gives the module path {module_path!r}, which leads outside the "
                         f"folder (to {joined}); a module of a sentence-transformers folder lies inside it: fix "
                         "the path, or copy the module into the folder")
    return joined


def read_sentence_transformer_folder(path: str | os.PathLike) -> SentenceTransformerLayout | None:
    """The layout of a sentence-transformers folder, or None when ``path`` has no ``modules.json``.

    Raises:
        ValueError: ``modules.json`` or a module config is unreadable, lists a module that changes the
            embedding beyond pooling and normalisation (``Dense`` ...), or a module path outside the folder.
    """
    root = Path(path)
    if not (root / "modules.json").is_file():
        return None
    entries = _read_json(root / "modules.json")
    if not isinstance(entries, list):
        raise ValueError(f"{root / 'modules.json'} must hold a list of modules, got {type(entries).__name__}")
    model_path, pooling, normalize, include_prompt = root, None, False, True
    for entry in sorted(entries, key=lambda item: item.get("idx", 0)):
        kind = _module_kind(entry)
        module_path = _inside(root, entry.get("path", ""))
        if kind in ("Transformer", "MLMTransformer"):  # the latter: older SparseEncoder folders' fill-mask module
            model_path = module_path
        elif kind == "SpladePooling":  # a SparseEncoder (SPLADE) folder: gradcache.models.splade encodes it
            pooling = SPLADE_POOLING
        elif kind == "Pooling":
            settings = _read_json(module_path / "config.json")
            pooling, include_prompt = _pooling_mode(settings), bool(settings.get("include_prompt", True))
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(
                f"{root / 'modules.json'} lists a {kind!r} module, which HuggingFaceEncoder does not apply "
                "(it applies Transformer, Pooling and Normalize); build the model yourself and pass the nn.Module"
            )
    max_seq_length = None
    for settings in (model_path / "sentence_bert_config.json", root / "sentence_bert_config.json"):
        if settings.is_file():
            max_seq_length = _read_json(settings).get("max_seq_length")
            break
    prompts = {}
    if (root / "config_sentence_transformers.json").is_file():
        prompts = _read_json(root / "config_sentence_transformers.json").get("prompts") or {}
    passage_name = next((name for name in PASSAGE_PROMPT_NAMES if prompts.get(name)), None)
    return SentenceTransformerLayout(model_path=model_path, pooling=pooling, normalize=normalize,
                                     max_seq_length=max_seq_length, include_prompt=include_prompt,
                                     query_prompt=prompts.get(QUERY_PROMPT_NAME) or None,
                                     passage_prompt=None if passage_name is None else prompts[passage_name])
