"""The training modes by name: `gradcache train <name>`, and the kinds of model `gradcache train text --kind`
trains. Add a mode: a `Mode` subclass in this folder, and one entry in `MODES`; add a kind of text model: a `Text`
subclass with its own `kind`, and one entry in `TEXT_KINDS`. Nothing outside this folder asks a mode or a kind its
name: the commands ask the object (`LoadedModel.mode`, modes/loaded_model.py)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import Mode
from gradcache.train.modes.clip import CLIP
from gradcache.train.modes.cross_encoder import CrossEncoderText
from gradcache.train.modes.multi_vector import MultiVector
from gradcache.train.modes.simclr import SimCLR
from gradcache.train.modes.sparse import SparseText
from gradcache.train.modes.text import Text
from gradcache.train.modes.vision_language import VisionLanguage

if TYPE_CHECKING:
    from gradcache.train.config import RunConfig

TEXT_KINDS: dict[str, Text] = Text.kinds  # the kinds read their own table without importing this module
TEXT_KINDS.update({kind.kind: kind for kind in (Text(), MultiVector(), SparseText(), CrossEncoderText())})
# vlm before text: a VLM folder is also a Hugging Face or sentence-transformers folder, which text would claim, and
# `folder_reader` asks every kind in this order
MODES: dict[str, Mode] = {mode.name: mode for mode in (SimCLR(), CLIP(), VisionLanguage(), TEXT_KINDS[Text.kind])}
DEFAULT_MODE = SimCLR.name  # `gradcache train` without a mode


def mode_of(config: RunConfig) -> Mode:
    """The mode a run trains in: `gradcache train <mode>`, and for text the `--kind` of model."""
    return TEXT_KINDS[config.kind] if config.mode == Text.name else MODES[config.mode]


def every_kind() -> list[Mode]:
    """Every mode and every kind of text model, each once: the objects a trained model may be."""
    return list({id(mode): mode for mode in (*MODES.values(), *TEXT_KINDS.values())}.values())


def kinds_of(mode: Mode) -> list[Mode]:
    """The kinds of model `gradcache train <mode>` trains (`--kind`): text's `TEXT_KINDS`, another mode itself."""
    return [kind for kind in every_kind() if kind.name == mode.name]


def folder_reader(found: ModelFolderFormat | None, folder: Path) -> Mode | None:
    """The mode or kind that loads the model folder `folder` of format `found` (None: a format model_folders.py does
    not know) (`Mode.reads_folder`), or None."""
    return next((kind for kind in every_kind() if kind.reads_folder(found, folder)), None)


__all__ = ["DEFAULT_MODE", "MODES", "TEXT_KINDS", "Mode", "every_kind", "folder_reader", "kinds_of", "mode_of"]
