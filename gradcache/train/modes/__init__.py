"""The training modes by name: `gradcache train <name>`, and the kinds of model `gradcache train text --kind`
trains. Add a mode: a `Mode` subclass in this folder, and one entry here; add a kind of text model: a `Text`
subclass with its own `kind`, and one entry in `TEXT_KINDS`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from gradcache.train.modes.base import Mode
from gradcache.train.modes.clip import CLIP
from gradcache.train.modes.cross_encoder import CrossEncoderText
from gradcache.train.modes.multi_vector import MultiVector
from gradcache.train.modes.simclr import SimCLR
from gradcache.train.modes.sparse import SparseText
from gradcache.train.modes.text import Text

if TYPE_CHECKING:
    from gradcache.train.config import RunConfig

TEXT_KINDS: dict[str, Text] = {kind.kind: kind for kind in (Text(), MultiVector(), SparseText(), CrossEncoderText())}
MODES: dict[str, Mode] = {mode.name: mode for mode in (SimCLR(), CLIP(), TEXT_KINDS["dense"])}


def mode_of(config: RunConfig) -> Mode:
    """The mode a run trains in: `gradcache train <mode>`, and for text the `--kind` of model."""
    return TEXT_KINDS[config.kind] if config.mode == "text" else MODES[config.mode]


__all__ = ["MODES", "TEXT_KINDS", "Mode", "mode_of"]
