"""A Hugging Face sequence classifier with one label as a cross-encoder (reranker): a (query, passage) pair, read
together, to one score, as sentence-transformers' `CrossEncoder` scores it before its activation."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from gradcache.models.checkpointing import hugging_face_checkpointing
from gradcache.models.hf_tokenizer import TOKENIZER_FILES
from gradcache.models.huggingface import check_weights
from gradcache.models.model_positions import max_positions
from gradcache.models.tokenizer_match import check_tokenizer_model
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
from gradcache.pair_scorer import PairScorer
from gradcache.ranges import is_int


def weights_folder(path: str | os.PathLike) -> Path:
    """Where a folder's Hugging Face model lies: the folder itself, or a sentence-transformers folder's
    `Transformer` module path."""
    layout = read_sentence_transformer_folder(path)
    return Path(path) if layout is None else layout.model_path


def pair_length(folder: str | os.PathLike) -> int:
    """The most tokens per (query, passage) pair `CrossEncoder` truncates a folder's pairs at: its tokenizer's
    `model_max_length` (tokenizer_config.json), at most the model's positions (config.json's
    max_position_embeddings, models/model_positions.py); read as JSON, before anything loads.

    Raises:
        ValueError: a `model_max_length` that is not a whole number of at least 2 tokens (-1, a string, a list), or
            no bound at all (no positions, and a `model_max_length` absent or transformers' "unset"), naming the
            file and the key.
    """
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    from gradcache.models.sentence_transformers_folder import read_json_object

    source = weights_folder(folder)
    positions = max_positions(source)
    path = source / "tokenizer_config.json"
    length = read_json_object(path).get("model_max_length") if path.is_file() else None
    if length is not None and not is_int(length, 2):
        raise ValueError(f"{path}: model_max_length {length!r} is not a whole number of at least 2 tokens (two "
                         f"special tokens), the most a pair keeps; set it to at most {positions or 512}, or give "
                         "--max-length")
    if length is None or length >= VERY_LARGE_INTEGER:  # transformers' "unset"
        length = None
    if positions is None and length is None:
        raise ValueError(f"neither {source / 'config.json'} (max_position_embeddings) nor {path} (model_max_length) "
                         "bounds the tokens of a pair; give --max-length")
    return min(value for value in (length, positions) if value is not None)


class HuggingFaceCrossEncoder(PairScorer):
    """s(q, p) = AutoModelForSequenceClassification(folder, num_labels=1)(**tokenizer(q, p)).logits, (B,) per chunk.

    The pair is tokenised as sentence-transformers' `CrossEncoder.preprocess` tokenises it: the folder's own
    tokenizer called on (queries, passages) with padding to the chunk's longest pair and `longest_first`
    truncation at `max_length` tokens for the pair. A base model folder (an encoder without a classification
    head, e.g. a sentence-transformers embedder) gets a new one-label head, initialised as transformers
    initialises it (from the global random state); a cross-encoder folder keeps its own head. The score is the
    raw logit; `CrossEncoder.predict` applies Sigmoid to it.

    Args:
        folder: a local Hugging Face or sentence-transformers model folder with its tokenizer.
        max_length: most tokens per (query, passage) pair.

    Raises:
        ImportError: transformers is not installed.
        ValueError: the folder holds no model or tokenizer that loads offline, a head with more than one label, or
            the tokenizer of another model (`check_tokenizer_model`).

    Example:
        >>> scorer = HuggingFaceCrossEncoder("/data/tiny-bert", max_length=128)
        >>> scorer([("who bakes bread?", "the baker bakes bread")])  # tensor of shape (1,)
    """

    def __init__(self, folder: str | os.PathLike, max_length: int) -> None:
        try:
            import transformers
        except ImportError as error:
            raise ImportError('the cross-encoder needs the transformers package: pip install -e ".[hf]"') from error
        source = weights_folder(folder)
        if not (source / "config.json").is_file():
            raise ValueError(f"{source} has no config.json, so it is not a Hugging Face model folder")
        if not any((source / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{source} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
        check_weights(source)
        try:
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                os.fspath(source), num_labels=1, local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(source), local_files_only=True)
        except pickle.UnpicklingError as error:
            raise ValueError(f"the weights of {source} hold more than tensors; save them as model.safetensors") \
                from error
        except (OSError, RuntimeError, EOFError, ValueError, KeyError) as error:
            raise ValueError(f"{source} does not load as a one-label sequence classifier: "
                             f"{str(error).splitlines()[0]}") from error
        check_tokenizer_model(tokenizer, source)  # another model's tokenizer class over the folder's vocabulary
        super().__init__(model, tokenizer, max_length=max_length)
        self.train()  # from_pretrained returns eval mode; the wrapper's mode governs the model from here on

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """The model's own activation checkpointing (non-reentrant), as `HuggingFaceEncoder`'s."""
        hugging_face_checkpointing(self.model, enabled)


__all__ = ["HuggingFaceCrossEncoder", "pair_length", "weights_folder"]

