"""`RUN/model/` written atomically, from a trained model or from any checkpoint of a run.

The mode decides the format (`Mode.export`: sentence-transformers for text, open_clip's files for
`--model open_clip:ARCH`, gradcache's built-in format otherwise); this module writes it into a temporary folder
beside the output, then renames it into place, so the output is either the previous export or the new one whole,
never half of one. The files get the permissions the user's umask gives (run_folder/permissions.py), whatever
the libraries that wrote them chose (safetensors writes 0600).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from gradcache.models.open_clip import weights_loaded_next
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint, checkpoint_kinds, kind_in, locate
from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError, ModelFolderDiskFull, UsageError, out_of_space
from gradcache.train.export.model_card import write_model_card
from gradcache.train.model_folders import ModelFolderFormat, model_folder_format
from gradcache.train.modes import mode_of
from gradcache.train.run_folder.permissions import as_if_created

MODEL_FOLDER = "model"  # RUN/model/
CHECKPOINT_CHOICES = ("last", "previous")  # --checkpoint, or a checkpoint file
_REPLACEABLE = {ModelFolderFormat.SENTENCE_TRANSFORMERS, ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS,
                ModelFolderFormat.OPEN_CLIP, ModelFolderFormat.BUILT_IN, ModelFolderFormat.MULTI_VECTOR,
                ModelFolderFormat.SPARSE_ENCODER, ModelFolderFormat.CROSS_ENCODER}


def check_output(output: str | os.PathLike) -> None:
    """Refuse an `output` that export would not replace: anything but nothing, an empty folder, or a model folder
    an export wrote (UsageError, before anything is read or written)."""
    output = Path(output)
    if not output.exists():
        return
    if output.is_dir() and not any(output.iterdir()):
        return
    kind = None
    if output.is_dir():
        try:
            kind = model_folder_format(output)
        except UsageError:
            pass
    if kind not in _REPLACEABLE:
        raise UsageError(f"--output {str(output)!r} exists and is not a model folder that gradcache export wrote, so it "
                         "is left alone; give a new folder (or remove that one)")


def export_model(config: RunConfig, model: nn.Module, loss: nn.Module, output: str | os.PathLike,
                 metrics: dict[str, Any] | None = None) -> Path:
    """Write `model` (with its trained `loss`: CLIP's temperature) in its mode's format to the folder `output`,
    atomically, replacing a previous export there, with a model card (`metrics`: the final evaluation's, where
    known); return `output`.

    Raises:
        ModelFolderDiskFull: the disk filled (exit status 74), whatever error the writing library made of it;
            `output` keeps what it held.
    """
    output = Path(output)
    check_output(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial"))
    try:
        mode_of(config).export(config, model, loss, partial)
        write_model_card(partial, output, config, metrics)
        for path in (partial, *partial.rglob("*")):
            as_if_created(path)  # mkdtemp makes 0700 and safetensors writes 0600: set what open() and mkdir() give
        if output.exists():
            old = output.with_name(f".{output.name}.{os.getpid()}.replaced")
            os.replace(output, old)
            os.replace(partial, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, output)
    except Exception as error:
        needed = _bytes_of(model, loss)
        full = out_of_space(error, partial, needed)  # before the partial folder goes
        shutil.rmtree(partial, ignore_errors=True)
        if full:
            raise ModelFolderDiskFull(output, needed, shutil.disk_usage(output.parent).free,
                                      _export_command(config, output)) from error
        raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return output


def _bytes_of(*modules: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for module in modules for t in module.state_dict().values())


def _export_command(config: RunConfig, output: Path) -> str:
    """The command that writes `output` again from the run's last checkpoint."""
    default = Path(config.output_dir) / MODEL_FOLDER if config.output_dir else None
    return f"gradcache export {config.output_dir}" + ("" if output == default else f" --output {output}")


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
    check_output(output)
    config = dataclasses.replace(RunConfig.from_dict(saved.meta()["args"]), device="cpu")
    mode = mode_of(config)
    try:  # a text run is rebuilt from its --model folder: the architecture and the tokenizer
        with weights_loaded_next():  # the checkpoint's weights go in below
            model = mode.build_model(config)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot rebuild the model of {saved} from its --model {config.model}: {error}") from error
    trained = nn.ModuleDict({"model": model, "loss": mode.build_loss(config)})
    saved.load(trained)
    return export_model(config, trained["model"], trained["loss"], output)
