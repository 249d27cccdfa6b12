"""The training modes by name: `gradcache train <name>`. Add a mode: a `Mode` subclass in this folder, and one
entry here."""
from gradcache.train.modes.base import Mode
from gradcache.train.modes.clip import CLIP
from gradcache.train.modes.simclr import SimCLR

MODES: dict[str, Mode] = {mode.name: mode for mode in (SimCLR(), CLIP())}

__all__ = ["MODES", "Mode"]
