"""The strategies and losses by name: the one registry that `negatives_per_anchor`, the training program's
`--strategy` and its modes' losses read (a name, the class and an instance all name the same thing)."""
from __future__ import annotations

from torch import nn

from gradcache.baselines import FullBatch, NaiveAccumulation
from gradcache.cache import GradCache
from gradcache.cached_loss import CachedLoss
from gradcache.losses import ClipLoss, InfoNCE, NTXent, SigLipLoss

STRATEGIES: dict[str, type] = {"gradcache": GradCache, "cached_loss": CachedLoss, "full": FullBatch,
                               "naive": NaiveAccumulation}
LOSSES: dict[str, type[nn.Module]] = {"ntxent": NTXent, "clip": ClipLoss, "siglip": SigLipLoss, "infonce": InfoNCE}


def name_of(value: object, names: dict[str, type], argument: str) -> str:
    """The key of `names` that `value` (a name, the class or an instance) stands for; ValueError if none."""
    if isinstance(value, str) and value in names:
        return value
    for name, kind in names.items():
        if value is kind or isinstance(value, kind) or (isinstance(value, type) and issubclass(value, kind)):
            return name
    raise ValueError(f"{argument}={value!r} is not one of {sorted(names)} (a name, the class or an instance).")
