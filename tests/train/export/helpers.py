"""The program's own view of a run: its model rebuilt from the newest checkpoint, as `gradcache eval` does."""
from __future__ import annotations

import dataclasses

from torch import nn

from gradcache.train.checkpoints.run_checkpoint import open_checkpoint
from gradcache.train.config import RunConfig
from gradcache.train.modes import MODES


def program_model(path) -> tuple[RunConfig, nn.Module, nn.Module]:
    """(config, model in eval mode, loss) of the checkpoint `path` (a run folder or a checkpoint file)."""
    saved = open_checkpoint(path)
    config = dataclasses.replace(RunConfig.from_dict(saved.meta()["args"]), device="cpu")
    mode = MODES[config.mode]
    trained = nn.ModuleDict({"model": mode.build_model(config), "loss": mode.build_loss(config)})
    saved.load(trained)
    return config, trained["model"].eval(), trained["loss"]
