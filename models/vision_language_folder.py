"""A vision-language model folder read for use: a Hugging Face VLM folder (``save_pretrained`` of a model of the
Qwen2-VL / Qwen2.5-VL, Idefics3 / SmolVLM, LLaVA or Gemma3 families, with its processor), or a sentence-transformers
folder whose ``Transformer`` module holds such a model and its processor (gradcache's export of a VLM run).

A sentence-transformers folder is read as sentence-transformers 6.3 reads it: its ``Pooling`` (``lasttoken`` or
``mean``) and ``Normalize``, ``sentence_bert_config.json``'s ``max_seq_length``, and the ``"query"`` and
``"document"`` prompts of ``config_sentence_transformers.json``. Its processor's own image size is the pixel budget
(an export writes the run's ``--max-pixels`` there), so ``max_pixels`` is None. What would change the embedding
and is not applied here (processor keyword arguments, per-task lengths, other modules) is refused by name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradcache.models.sentence_transformers_folder import (
    _check_transformer_config,
    _inside,
    _module_kind,
    _pooling_mode,
    PASSAGE_PROMPT_NAMES,
    QUERY_PROMPT_NAME,
    read_json_object,
    read_max_seq_length,
    read_modules,
    read_prompts,
    transformer_config,
)
from gradcache.models.vision_language import VLM_POOLINGS, VisionLanguageEncoder

# transformers' model_type of the VLM families VisionLanguageEncoder reads; another folder counts as one when its
# config holds a vision config and an image token (a VLM whose language model reads image tokens, not CLIP).
VISION_LANGUAGE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "llava", "gemma3")
_IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")


@dataclass(frozen=True)
class VisionLanguageFolder:
    """A vision-language model ready to embed, and how its folder says to use it.

    Args:
        encoder: the model as a `VisionLanguageEncoder`, in eval mode on the CPU.
        processor: its transformers processor (for `VisionLanguageCollator`).
        pooling: ``"last"`` or ``"mean"`` (a Hugging Face folder: ``"last"``).
        max_length: the most tokens an input may hold (``max_seq_length``); None: no bound given.
        max_pixels: each image's pixel budget beyond the processor's own; None: the processor's own size.
        query_prompt, passage_prompt: the texts put before queries' and passages' content; None: none.
    """

    encoder: VisionLanguageEncoder
    processor: Any
    pooling: str
    max_length: int | None
    max_pixels: int | None
    query_prompt: str | None
    passage_prompt: str | None


def is_vision_language_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a vision-language model (its config.json, or its sentence-transformers Transformer
    module's), told from `modules.json` and `config.json` alone: a model_type of `VISION_LANGUAGE_MODEL_TYPES`, or a
    `vision_config` beside an image token. No weights are read; an unreadable file is False."""
    root = Path(folder)
    try:
        model_path = _model_path(root) if (root / "modules.json").is_file() else root
        config = read_json_object(model_path / "config.json") if (model_path / "config.json").is_file() else {}
    except ValueError:
        return False
    if config.get("model_type") in VISION_LANGUAGE_MODEL_TYPES:
        return True
    return isinstance(config.get("vision_config"), dict) and any(key in config for key in _IMAGE_TOKEN_KEYS)


def read_vision_language_folder(folder: str | os.PathLike) -> VisionLanguageFolder:
    """The model of `folder` (a Hugging Face VLM folder, or a sentence-transformers folder holding one: module
    docstring) with its processor and the settings its files give.

    Raises:
        ValueError: not a vision-language folder; a sentence-transformers folder with modules other than
            Transformer, Pooling (``lasttoken`` or ``mean``) and Normalize, a module path outside it, or settings
            that change the embedding and are not applied here; a processor without a tokenizer and an image
            token; a model that does not load (the message names the file and the key, or the folder).
    """
    root = Path(folder)
    if not is_vision_language_folder(root):
        raise ValueError(f"{root} holds no vision-language model: its config.json (or its sentence-transformers "
                         f"Transformer module's) names a model_type of none of {VISION_LANGUAGE_MODEL_TYPES} and no "
                         "vision_config with an image token; give a folder save_pretrained wrote for such a model")
    if (root / "modules.json").is_file():
        model_path, pooling, normalize = _sentence_transformer_modules(root)
        settings_path, settings = transformer_config(model_path, root)
        _check_transformer_config(settings_path, settings)
        max_length = read_max_seq_length(settings_path, settings, model_path)
        prompts = read_prompts(root)
        passage_name = next((name for name in PASSAGE_PROMPT_NAMES if prompts.get(name)), None)
        query_prompt = prompts.get(QUERY_PROMPT_NAME) or None
        passage_prompt = None if passage_name is None else prompts[passage_name]
    else:
        model_path, pooling, normalize = root, VLM_POOLINGS[0], True
        max_length = query_prompt = passage_prompt = None
    processor = _processor(model_path)
    encoder = VisionLanguageEncoder(model_path, pooling=pooling, normalize=normalize).eval()
    return VisionLanguageFolder(encoder=encoder, processor=processor, pooling=pooling, max_length=max_length,
                                max_pixels=None, query_prompt=query_prompt, passage_prompt=passage_prompt)


def _model_path(root: Path) -> Path:
    """The folder of the Transformer module of the sentence-transformers folder `root` (the root when it lists
    none)."""
    for entry in read_modules(root):
        if _module_kind(entry) == "Transformer":
            return _inside(root, entry.get("path", ""))
    return root


def _sentence_transformer_modules(root: Path) -> tuple[Path, str, bool]:
    """(the Transformer's folder, the pooling as VisionLanguageEncoder names it, whether it normalises) of the
    sentence-transformers folder `root`: Transformer, Pooling and an optional Normalize, nothing else."""
    model_path, pooling, normalize = None, None, False
    for entry in read_modules(root):
        kind, module_path = _module_kind(entry), _inside(root, entry.get("path", ""))
        if kind == "Transformer":
            model_path = module_path
        elif kind == "Pooling":
            config = module_path / "config.json"
            pooling = _pooling_mode(config, read_json_object(config))
            if pooling not in VLM_POOLINGS:
                raise ValueError(f"{config}: pooling {pooling!r} is not one a vision-language embedder here applies "
                                 f"({', '.join(VLM_POOLINGS)}: lasttoken or mean); fix the key")
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(f"{root / 'modules.json'} lists a {kind!r} module, which a vision-language model here "
                             "does not apply (Transformer, Pooling and Normalize only); remove it, or load the "
                             "folder with sentence-transformers")
    if model_path is None or pooling is None:
        missing = "Transformer" if model_path is None else "Pooling"
        raise ValueError(f"{root / 'modules.json'} lists no {missing} module; a vision-language sentence-transformers "
                         "folder holds Transformer, Pooling (lasttoken or mean) and optionally Normalize")
    return model_path, pooling, normalize


def _processor(model_path: Path) -> Any:
    """The transformers processor saved in `model_path` (local files only), checked to be a VLM's."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(os.fspath(model_path), local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"the processor in {model_path} does not load: {error}".splitlines()[0]) from error
    if getattr(processor, "tokenizer", None) is None or getattr(processor, "image_token", None) is None:
        raise ValueError(f"{model_path} holds a {type(processor).__name__}, not a vision-language processor (a "
                         "tokenizer and an image token); save the model's processor beside it "
                         "(processor.save_pretrained)")
    return processor
