"""`gradcache train vlm --model`: a vision-language preset (models/vision_language_presets.py, built from a config
with random weights), a local Hugging Face VLM folder with its processor, or a SentenceTransformer folder holding
one, as the program sees them (errors naming the option).

- `model_path(name)`: the folder of the Hugging Face model (a SentenceTransformer folder's Transformer module), or
  None for a preset.
- `check_vision_language_model(option, name)`: cheap, from config.json alone: a VLM of a family the mode reads, with
  a processor beside it.
- `build_encoder(config)`, `processor(config)`: the model and its processor. A preset's processor is rebuilt, the
  same every time, over the built-in captions' words (`caption_words`): nothing of it is kept in the run folder.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from gradcache import distributed
from gradcache.models import VisionLanguageEncoder, build_vision_language_model
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
from gradcache.models.vision_language_presets import VISION_LANGUAGE_PRESETS
from gradcache.train.config import RunConfig
from gradcache.train.data.images.shapes import caption_words
from gradcache.train.errors import UsageError
from gradcache.train.modes.text_folders import quiet_transformers

# config.json's model_type of the VLM families the mode reads, and their names for messages
VLM_FAMILIES = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "idefics3": "Idefics3", "smolvlm": "SmolVLM"}
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # what save_pretrained of a processor writes
FAMILIES = ", ".join(VLM_FAMILIES.values())


def is_preset(name: str) -> bool:
    return name in VISION_LANGUAGE_PRESETS


def model_path(name: str, option: str = "--model") -> Path | None:
    """The folder holding config.json of `option`'s model `name`: the folder, or a SentenceTransformer folder's
    Transformer module; None for a preset. UsageError for a SentenceTransformer folder that cannot be read."""
    if is_preset(name):
        return None
    folder = Path(name)
    try:
        layout = read_sentence_transformer_folder(folder) if folder.is_dir() else None
    except ValueError as error:
        raise UsageError(f"{option} {name}: {error}") from error
    return folder if layout is None else layout.model_path


def model_type(path: Path, option: str, name: str) -> str:
    """config.json's model_type in `path`, read as JSON (nothing built), or UsageError naming `option`."""
    config = path / "config.json"
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"{option} {name}: cannot read {config} ({error}); give a Hugging Face VLM folder "
                         f"({FAMILIES}) with its processor, or a preset ({', '.join(VISION_LANGUAGE_PRESETS)})"
                         ) from error
    return values.get("model_type") if isinstance(values, dict) else None


def check_vision_language_model(option: str, name: str) -> None:
    """`name` is a preset, or a folder whose config.json is a VLM of `VLM_FAMILIES` and which holds its processor;
    else UsageError naming `option`, the folder and the families read. Reads config.json alone."""
    path = model_path(name, option)
    if path is None:
        return
    if not Path(name).is_dir():
        raise UsageError(f"{option} {name} is neither a folder nor a vision-language preset; give a local Hugging "
                         f"Face VLM folder ({FAMILIES}) with its processor, a SentenceTransformer folder holding "
                         f"one, or a preset: {', '.join(VISION_LANGUAGE_PRESETS)}")
    found = model_type(path, option, name)
    if found not in VLM_FAMILIES:
        raise UsageError(f"{option} {name} holds a model of type {found!r}, not a vision-language model the vlm mode "
                         f"reads ({FAMILIES}: model_type {', '.join(VLM_FAMILIES)}); give such a folder, or train "
                         "a text model with gradcache train text")
    if not any((path / file).is_file() for file in PROCESSOR_FILES):
        raise UsageError(f"{option} {name}: {path} holds no processor ({' or '.join(PROCESSOR_FILES)}); save it "
                         "beside the model (processor.save_pretrained(folder))")


def build_encoder(config: RunConfig) -> VisionLanguageEncoder:
    """`--model`'s VLM as an embedder at `--pooling`, its vision tower frozen unless `--train-vision`; a preset's
    random weights drawn from `--seed`. Over several processes its tower runs in every forward (a stand-in image
    where a chunk holds none: `always_run_vision`), so every rank gathers and reduces the same parameters."""
    settings = dict(pooling=config.pooling, train_vision=config.train_vision,
                    always_run_vision=distributed.world_size() > 1)
    if is_preset(config.model):
        model, _ = build_vision_language_model(config.model, caption_words(), seed=config.seed)
        return VisionLanguageEncoder(model, **settings)
    quiet_transformers()
    try:
        return VisionLanguageEncoder(model_path(config.model), **settings)
    except (ValueError, OSError) as error:
        raise UsageError(f"--model {config.model}: {error}") from error


def processor(config: RunConfig) -> Any:
    """`--model`'s processor: a preset's rebuilt (the same every time), a folder's read offline."""
    if is_preset(config.model):
        return _preset_processor(config.model)
    return folder_processor(model_path(config.model), "--model", config.model)


def folder_processor(path: Path, option: str, name: str) -> Any:
    """The processor saved in `path`, read offline (UsageError naming `option` where it does not load)."""
    from transformers import AutoProcessor

    quiet_transformers()
    try:
        return AutoProcessor.from_pretrained(os.fspath(path), local_files_only=True)
    except (ValueError, OSError) as error:
        raise UsageError(f"{option} {name}: its processor does not load: {error}".splitlines()[0]) from error


@functools.lru_cache(maxsize=4)
def _preset_processor(name: str) -> Any:
    """A preset's processor over the built-in captions' words (built once per process: it never changes)."""
    return build_vision_language_model(name, caption_words())[1]
