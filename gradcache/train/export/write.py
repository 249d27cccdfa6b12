"""`RUN/model/` written atomically, from a trained model (the end of a run; `gradcache export RUN` rebuilds one from a
checkpoint: gradcache/train/commands/export.py).

The mode or kind decides the format (`Mode.export`: sentence-transformers for text, open_clip's files for
`--model open_clip:ARCH`, gradcache's built-in format otherwise) and what the model card says; it is handed in
(`Exporter`), so this package, below the modes whose folders it writes, never imports them. This module writes it
into a temporary folder
beside the output, then renames it into place, so the output is either the previous export or the new one whole,
never half of one. The files get the permissions the user's umask gives (run_folder/permissions.py), whatever
the libraries that wrote them chose (safetensors writes 0600).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from gradcache.train.config import RunConfig
from gradcache.train.errors import ModelFolderDiskFull, UsageError, out_of_space
from gradcache.train.export.model_card import Exporter, write_model_card
from gradcache.train.model_folders import ModelFolderFormat, model_folder_format
from gradcache.train.run_folder.permissions import as_if_created

MODEL_FOLDER = "model"  # RUN/model/
_REPLACEABLE = {ModelFolderFormat.SENTENCE_TRANSFORMERS, ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS,
                ModelFolderFormat.OPEN_CLIP, ModelFolderFormat.BUILT_IN, ModelFolderFormat.MULTI_VECTOR,
                ModelFolderFormat.SPARSE_ENCODER, ModelFolderFormat.CROSS_ENCODER}


def check_output(output: str | os.PathLike, own_format: Callable[[Path], bool] = lambda folder: False) -> None:
    """Refuse an `output` that export would not replace: anything but nothing, an empty folder, or a model folder
    an export wrote, of a format model_folders.py knows or one `own_format` tells (a kind's own: `Mode.reads_folder`)
    (UsageError, before anything is read or written)."""
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
    if kind not in _REPLACEABLE and not (output.is_dir() and own_format(output)):
        raise UsageError(f"--output {str(output)!r} exists and is not a model folder that gradcache export wrote, so it "
                         "is left alone; give a new folder (or remove that one)")


def export_model(config: RunConfig, model: nn.Module, loss: nn.Module, output: str | os.PathLike,
                 metrics: dict[str, Any] | None = None, *, mode: Exporter) -> Path:
    """Write `model` (with its trained `loss`: CLIP's temperature) in the format of its `mode` (the run's mode or
    kind, `mode_of(config)`) to the folder `output`, atomically, replacing a previous export there, with a model card
    (`metrics`: the final evaluation's, where known); return `output`.

    Raises:
        ModelFolderDiskFull: the disk filled (exit status 74), whatever error the writing library made of it;
            `output` keeps what it held.
    """
    output = Path(output)
    check_output(output, lambda folder: mode.reads_folder(None, folder))
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial"))
    try:
        mode.export(config, model, loss, partial)
        write_model_card(partial, output, config, metrics, mode)
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
