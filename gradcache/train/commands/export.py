"""`gradcache export RUN [--checkpoint last|previous|FILE] [--output FOLDER]`: a checkpoint's model, rebuilt from the
options it stores by its mode or kind, written as the run writes `RUN/model/` at its end
(gradcache/train/export/write.py)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from torch import nn

from gradcache.models.open_clip import weights_loaded_next
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint, checkpoint_kinds, kind_in, locate
from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError, UsageError
from gradcache.train.export.write import check_output, export_model
from gradcache.train.modes import folder_reader, mode_of

CHECKPOINT_CHOICES = ("last", "previous")  # --checkpoint, or a checkpoint file


def choose_checkpoint(run: str | os.PathLike, checkpoint: str = "last") -> RunCheckpoint:
    """`--checkpoint`: the run folder's newest good checkpoint (`last`; a damaged last.pt falls back to previous.pt
    with a warning), its `previous` one, or a checkpoint file or folder given by path.

    Raises:
        CheckpointError: no such checkpoint, or it fails its checks.
    """
    if checkpoint not in CHECKPOINT_CHOICES:
        return locate(checkpoint).chosen
    folder = Path(run)
    if not folder.is_dir():
        raise CheckpointError(f"run {str(folder)!r} is not a folder; give the run folder of gradcache train")
    if checkpoint == "last":
        found = locate(folder)
        found.warn()
        return found.chosen
    kind = kind_in(folder)
    if kind is not None and (folder / kind.previous_name).exists():
        chosen = kind(folder / kind.previous_name)
        chosen.check()
        return chosen
    names = [kind.previous_name for kind in checkpoint_kinds()]
    raise CheckpointError(f"{folder} holds no previous checkpoint ({', '.join(names[:-1])} or {names[-1]}): a run "
                          "has one after its second save; use --checkpoint last")


def export_checkpoint(saved: RunCheckpoint, output: str | os.PathLike) -> Path:
    """The model of the checkpoint `saved`, rebuilt from the options it stores, exported to `output` (on CPU).

    Raises:
        CheckpointError: it does not hold a model of its own options.
        UsageError: `output` is not replaceable, or what the model was built from (a text run's --model folder)
            is gone.
    """
    check_output(output, written_by_a_kind)
    config = dataclasses.replace(RunConfig.from_dict(saved.meta()["args"]), device="cpu")
    mode = mode_of(config)
    try:  # a text run is rebuilt from its --model folder: the architecture and the tokenizer
        with weights_loaded_next():  # the checkpoint's weights go in below
            model = mode.build_model(config)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot rebuild the model of {saved} from its --model {config.model}: {error}") from error
    trained = nn.ModuleDict({"model": model, "loss": mode.build_loss(config)})
    saved.load(trained)
    return export_model(config, trained["model"], trained["loss"], output, mode=mode)


def written_by_a_kind(folder: Path) -> bool:
    """A folder of a format only its kind knows (`Mode.reads_folder`), which an export of that kind wrote."""
    return folder_reader(None, folder) is not None
