"""What format a model folder is in, by the files it holds: the one place that tells the formats apart, for
`gradcache export` (which writes them), for the modes and kinds (which read their own) and for the commands that read
any MODEL argument (encode, eval, mine).

| format | recognised by | load it with |
|---|---|---|
| `RUN` | `last.pt`, `previous.pt`, `last.dcp` or `previous.dcp` | `gradcache export RUN`, `gradcache eval RUN` |
| `MULTI_VECTOR` | `modules.json` + `model_type` "MultiVectorEncoder" in `config_sentence_transformers.json` | `MultiVectorEncoder(folder)` |
| `SPARSE_ENCODER` | `modules.json` listing a `SpladePooling` module | `SparseEncoder(folder)` |
| `CROSS_ENCODER` | `modules.json` + `config_sentence_transformers.json` of `model_type` CrossEncoder | `CrossEncoder(folder)` |
| `SENTENCE_TRANSFORMERS` | any other `modules.json` | `SentenceTransformer(folder)` |
| `SENTENCE_TRANSFORMERS_TOWERS` | `query/` and `passage/`, each a sentence-transformers folder | one `SentenceTransformer` per side |
| `OPEN_CLIP` | `open_clip_model.safetensors` + `open_clip_config.json` | `open_clip.create_model("local-dir:" + folder)` |
| `BUILT_IN` | `config.json` with `gradcache_architecture` + `model.safetensors` | `gradcache.models.from_pretrained(folder)` |
| `HUGGING_FACE` | any other `config.json` (written by `save_pretrained`) | `transformers.AutoModel.from_pretrained(folder)` |

A run's `model/` folder is one of the middle eight (gradcache/train/export/, each mode's `export`).
"""
from __future__ import annotations

import enum
import json
import os
from pathlib import Path

from gradcache.models.multi_vector_folder import is_multi_vector_folder
from gradcache.models.pretrained import ARCHITECTURE_KEY, CONFIG_FILE
from gradcache.models.sentence_transformers_folder import SPLADE_POOLING, read_sentence_transformer_folder
from gradcache.train.checkpoints.run_checkpoint import FileCheckpoint, ShardedCheckpoint
from gradcache.train.errors import UsageError

OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"  # the names open_clip looks for in a hub or local-dir folder
OPEN_CLIP_CONFIG = "open_clip_config.json"
QUERY_FOLDER, PASSAGE_FOLDER = "query", "passage"  # --separate-towers: one sentence-transformers folder per side
RUN_CHECKPOINTS = (FileCheckpoint.name, FileCheckpoint.previous_name, ShardedCheckpoint.name,
                   ShardedCheckpoint.previous_name)


class ModelFolderFormat(str, enum.Enum):
    RUN = "run"
    MULTI_VECTOR = "multi-vector"
    SENTENCE_TRANSFORMERS = "sentence-transformers"
    SPARSE_ENCODER = "sparse-encoder"
    CROSS_ENCODER = "cross-encoder"
    SENTENCE_TRANSFORMERS_TOWERS = "sentence-transformers-towers"
    OPEN_CLIP = "open_clip"
    BUILT_IN = "built-in"
    HUGGING_FACE = "hugging-face"


def model_folder_format(folder: str | os.PathLike) -> ModelFolderFormat:
    """The format of the model folder `folder` (the table of the module docstring).

    Raises:
        UsageError: `folder` is not a folder, or holds none of the files that tell a format (the message lists them);
            the commands map it to exit status 2.

    Example:
        >>> model_folder_format("runs/text-20261201-110000/model")
        <ModelFolderFormat.SENTENCE_TRANSFORMERS: 'sentence-transformers'>
    """
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"model {str(path)!r} is not a folder; give a run folder, its model/ folder, a "
                         "sentence-transformers or Hugging Face model folder")
    if any((path / name).exists() for name in RUN_CHECKPOINTS):
        return ModelFolderFormat.RUN
    if is_multi_vector_folder(path):
        return ModelFolderFormat.MULTI_VECTOR
    if (path / "modules.json").is_file():
        if _is_cross_encoder(path):
            return ModelFolderFormat.CROSS_ENCODER
        return ModelFolderFormat.SPARSE_ENCODER if _lists_splade_pooling(path) else ModelFolderFormat.SENTENCE_TRANSFORMERS
    if all((path / side / "modules.json").is_file() for side in (QUERY_FOLDER, PASSAGE_FOLDER)):
        return ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS
    if (path / OPEN_CLIP_WEIGHTS).is_file() and (path / OPEN_CLIP_CONFIG).is_file():
        return ModelFolderFormat.OPEN_CLIP
    config = path / CONFIG_FILE
    if config.is_file():
        try:
            values = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise UsageError(f"model {str(path)!r}: cannot read {CONFIG_FILE}: {error}") from error
        if isinstance(values, dict) and ARCHITECTURE_KEY in values:
            return ModelFolderFormat.BUILT_IN
        return ModelFolderFormat.HUGGING_FACE
    raise UsageError(f"model {str(path)!r} is a folder of an unknown kind: it holds none of {', '.join(RUN_CHECKPOINTS)} "
                     f"(a run folder), modules.json (sentence-transformers), {QUERY_FOLDER}/ and {PASSAGE_FOLDER}/ "
                     f"(separate towers), {OPEN_CLIP_WEIGHTS} (open_clip) or {CONFIG_FILE} (gradcache or Hugging "
                     "Face); give a run folder or the model/ folder gradcache export wrote")


def _lists_splade_pooling(folder: Path) -> bool:
    """Whether the sentence-transformers folder's modules.json lists SpladePooling (an unreadable one: no; its
    loader names what is wrong with it)."""
    try:
        layout = read_sentence_transformer_folder(folder)
    except ValueError:
        return False
    return layout is not None and layout.pooling == SPLADE_POOLING


def _is_cross_encoder(path: Path) -> bool:
    """A sentence-transformers folder that `CrossEncoder.save` wrote (its `model_type`)."""
    try:
        settings = json.loads((path / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(settings, dict) and settings.get("model_type") == "CrossEncoder"
