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

Every key of a module config is read: one that changes the embedding is applied as sentence-transformers applies
it (``do_lower_case``; a ``SpladePooling``'s ``pooling_strategy`` and ``activation_function``) or refused
(ValueError naming the file and the key: per-task lengths, a query expansion, keyword arguments for
transformers); one that changes nothing here (the embedding's dimension, the module's output name) is accepted;
any other key is a warning naming it.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

# The older boolean keys, mapped to the newer "pooling_mode" names, in sentence-transformers' order.
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_OUR_NAMES = {"lasttoken": "last"}  # sentence-transformers' mode names that HuggingFaceEncoder spells otherwise
POOLING_KEYS = {"pooling_mode", "include_prompt", "embedding_dimension", "word_embedding_dimension", *_LEGACY_KEYS}
TRANSFORMER_CONFIG = "sentence_bert_config.json"
# sentence_bert_config.json: keys applied here, and keys that change nothing for a text model here
TRANSFORMER_KEYS = {"max_seq_length", "do_lower_case", "transformer_task", "modality_config", "module_output_name",
                    "unpad_inputs"}
# keys that change the embedding and are not applied here: refused unless empty (None, {} or [])
TRANSFORMER_REFUSED = {
    "query_length": "per-task lengths", "document_length": "per-task lengths",
    "query_expansion": "a query expansion (a multi-vector model's)",
    "processing_kwargs": "keyword arguments for the tokenizer", "tokenizer_args": "keyword arguments for the tokenizer",
    "processor_kwargs": "keyword arguments for the tokenizer", "model_args": "keyword arguments for the model",
    "model_kwargs": "keyword arguments for the model", "config_args": "keyword arguments for the model's config",
    "config_kwargs": "keyword arguments for the model's config",
}
# SpladePooling's choices, as sentence-transformers' SpladePooling checks them; its first ones are the defaults
SPLADE_POOLING_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
SPLADE_KEYS = {"pooling_strategy", "activation_function", "embedding_dimension", "word_embedding_dimension",
               "chunk_size"}  # chunk_size: memory alone


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
        do_lower_case: ``sentence_bert_config.json``'s: texts are lower-cased before they are tokenised.
        splade_pooling, splade_activation: a ``SpladePooling``'s ``pooling_strategy`` (``"max"`` or ``"sum"``
            over tokens) and ``activation_function`` (``"relu"``: log(1 + relu(x)); ``"log1p_relu"``: that
            twice).
    """

    model_path: Path
    pooling: str | None
    normalize: bool
    max_seq_length: int | None
    include_prompt: bool = True
    query_prompt: str | None = None
    passage_prompt: str | None = None
    do_lower_case: bool = False
    splade_pooling: str = SPLADE_POOLING_STRATEGIES[0]
    splade_activation: str = SPLADE_ACTIVATIONS[0]


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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error


def read_json_object(path: Path) -> dict:
    """The JSON object in `path`; ValueError naming the file when it is unreadable or holds another value."""
    values = _read_json(path)
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(values).__name__}; restore the file "
                         "sentence-transformers saved")
    return values


def read_modules(root: Path) -> list[dict]:
    """`root/modules.json`'s modules in their `idx` order, each an object whose `type` and `path` are strings and
    whose `idx` is a whole number; ValueError naming the file and the key otherwise (a tampered list)."""
    path = root / "modules.json"
    entries = _read_json(path)
    if not isinstance(entries, list):
        raise ValueError(f"{path} must hold a list of modules, got {type(entries).__name__}")
    for place, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: module {place} is a {type(entry).__name__}, not an object with idx, type and "
                             "path; restore the file sentence-transformers saved")
        for key, kind, what in (("idx", int, "a whole number"), ("type", str, "a string"), ("path", str, "a string")):
            value = entry.get(key, 0 if key == "idx" else "")
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"{path}: module {place}'s {key} {value!r} is not {what}; restore the file "
                                 "sentence-transformers saved")
    return sorted(entries, key=lambda entry: entry.get("idx", 0))


def read_prompts(root: Path) -> dict[str, str]:
    """The `prompts` of `root/config_sentence_transformers.json` (empty when the file or the key is absent);
    ValueError naming the file and the key for a file that is not an object or prompts that are not texts."""
    path = root / "config_sentence_transformers.json"
    if not path.is_file():
        return {}
    prompts = read_json_object(path).get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(text, str) for text in prompts.values()):
        raise ValueError(f"{path}: prompts {prompts!r} must map prompt names to texts, e.g. "
                         '{"query": "query: ", "document": ""}; fix the key')
    return prompts


def read_max_seq_length(path: Path | None, values: dict, model_path: Path) -> int | None:
    """`max_seq_length` of a `sentence_bert_config.json` (`values`, read from `path`): None when absent, else a
    whole number from 2 to the model's positions (models/model_positions.py); ValueError naming the file and the
    key otherwise, before any text is tokenised to that length."""
    from gradcache.models.model_positions import check_tokens

    value = values.get("max_seq_length")
    return None if value is None else check_tokens(value, f"{path}: max_seq_length", model_path)


def _warn_unknown(path: Path, values: dict, known: set[str]) -> None:
    """A UserWarning naming the keys of `values` outside `known`; from this one line, so Python's default filter
    shows it once however many readers read the folder."""
    unknown = sorted(set(values) - known)
    if unknown:
        warnings.warn(f"{path}: key(s) {', '.join(map(repr, unknown))} unknown to this program, so not applied "
                      "(a misspelt key, or a setting of a newer sentence-transformers)", stacklevel=1)


def transformer_config(model_path: Path, root: Path) -> tuple[Path | None, dict]:
    """The Transformer module's ``sentence_bert_config.json`` (in its own folder, else the root) and its values;
    (None, {}) when there is none."""
    for path in (model_path / TRANSFORMER_CONFIG, root / TRANSFORMER_CONFIG):
        if path.is_file():
            return path, read_json_object(path)
    return None, {}


def lower_cases(path: Path | None, values: dict) -> bool:
    """``do_lower_case`` of a ``sentence_bert_config.json`` (False when absent); ValueError for a non-bool."""
    value = values.get("do_lower_case", False)
    if not isinstance(value, bool):
        raise ValueError(f"{path}: do_lower_case {value!r} must be true or false")
    return value


def _check_transformer_config(path: Path | None, values: dict) -> None:
    """Refuse (ValueError naming the key) what changes the embedding and is not applied; warn of unknown keys."""
    for key, what in TRANSFORMER_REFUSED.items():
        if values.get(key) not in (None, {}, []):
            raise ValueError(f"{path}: {key} {values[key]!r} sets {what}, which this program does not apply, so "
                             "its embeddings would differ from sentence-transformers'; remove the key (or set it "
                             "to null) to use the folder here")
    _warn_unknown(path, values, TRANSFORMER_KEYS | set(TRANSFORMER_REFUSED))


def _splade_settings(module_path: Path) -> tuple[str, str]:
    """A SpladePooling module's (pooling_strategy, activation_function), the defaults where its config.json is
    absent (as sentence-transformers builds it); ValueError naming the file and key for another value."""
    path = module_path / "config.json"
    values = read_json_object(path) if path.is_file() else {}
    settings = []
    for key, choices in (("pooling_strategy", SPLADE_POOLING_STRATEGIES), ("activation_function", SPLADE_ACTIVATIONS)):
        value = values.get(key, choices[0])
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{path}: {key} {value!r} is not one of {', '.join(map(repr, choices))}, the values "
                             "sentence-transformers' SpladePooling accepts; fix the key")
        settings.append(value)
    _warn_unknown(path, values, SPLADE_KEYS)
    return settings[0], settings[1]


def _pooling_mode(path: Path, config: dict) -> str:
    """The Pooling config's mode(s) joined by "+"; ValueError naming `path` for a pooling_mode that is neither a
    name nor a list of names."""
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else modes
        if not isinstance(modes, list) or not modes or not all(isinstance(mode, str) for mode in modes):
            raise ValueError(f"{path}: pooling_mode {config['pooling_mode']!r} is neither a mode's name (\"mean\", "
                             "\"cls\" ...) nor a list of them; fix the key")
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
            embedding beyond pooling and normalisation (``Dense`` ...), or a module path outside the folder; a
            module config sets what this program does not apply, or a value sentence-transformers refuses (module
            docstring); it names the file and the key.

    Warns:
        UserWarning: a module config holds a key this program does not know, naming it.
    """
    root = Path(path)
    if not (root / "modules.json").is_file():
        return None
    model_path, pooling, normalize, include_prompt = root, None, False, True
    splade = (SPLADE_POOLING_STRATEGIES[0], SPLADE_ACTIVATIONS[0])
    for entry in read_modules(root):
        kind = _module_kind(entry)
        module_path = _inside(root, entry.get("path", ""))
        if kind in ("Transformer", "MLMTransformer"):  # the latter: older SparseEncoder folders' fill-mask module
            model_path = module_path
        elif kind == "SpladePooling":  # a SparseEncoder (SPLADE) folder: gradcache.models.splade encodes it
            pooling, splade = SPLADE_POOLING, _splade_settings(module_path)
        elif kind == "Pooling":
            settings = read_json_object(module_path / "config.json")
            _warn_unknown(module_path / "config.json", settings, POOLING_KEYS)
            include_prompt = settings.get("include_prompt", True)
            if not isinstance(include_prompt, bool):
                raise ValueError(f"{module_path / 'config.json'}: include_prompt {include_prompt!r} must be true or "
                                 "false")
            pooling = _pooling_mode(module_path / "config.json", settings)
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(
                f"{root / 'modules.json'} lists a {kind!r} module (type {entry.get('type')!r}), which this "
                "program does not apply (it applies Transformer, Pooling, SpladePooling and Normalize); remove it "
                "from modules.json if the folder was edited, or build the model yourself and pass the nn.Module"
            )
    settings_path, settings = transformer_config(model_path, root)
    _check_transformer_config(settings_path, settings)
    prompts = read_prompts(root)
    passage_name = next((name for name in PASSAGE_PROMPT_NAMES if prompts.get(name)), None)
    return SentenceTransformerLayout(model_path=model_path, pooling=pooling, normalize=normalize,
                                     max_seq_length=read_max_seq_length(settings_path, settings, model_path),
                                     include_prompt=include_prompt,
                                     query_prompt=prompts.get(QUERY_PROMPT_NAME) or None,
                                     passage_prompt=None if passage_name is None else prompts[passage_name],
                                     do_lower_case=lower_cases(settings_path, settings),
                                     splade_pooling=splade[0], splade_activation=splade[1])
