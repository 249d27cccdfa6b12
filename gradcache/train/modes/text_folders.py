"""The text kinds' Hugging Face model folders as the program sees them: `gradcache.models.huggingface_folder`'s
finding and checking, with its library errors turned into `UsageError` naming the option that gave the folder.

- `text_model_folder(name, option)`: the packaged all-MiniLM-L6-v2, or a local folder.
- `check_text_folder(option, name, pooling, max_length)`: the folder and its tokenizer load offline and belong
  together, and `--max-length` fits the model's positions (`check_positions`, `--query-expansion`'s too).
- `text_tokenizer(config, model)` and `side_tokenizers(config)`: `--model`'s tokenizer, truncating at
  `--max-length`, and the query's and passage's (each text after its side's prompt; queries expanded as
  `query_expansion(config)` says).
- `quiet_transformers()`: no per-load progress bars of transformers on the program's stderr.
- `load_text_folder(kind, request, folder)`: a dense sentence-transformers or Hugging Face folder as the commands
  use it (`Text.load_folder`).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gradcache.models import HuggingFaceTokenizer
from gradcache.models import huggingface_folder
from gradcache.models.query_expansion import QueryExpansion
from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError

if TYPE_CHECKING:
    from gradcache.train.modes.base import Mode
    from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest


def quiet_transformers() -> None:
    """No per-load progress bars of transformers on the program's stderr (the run has its own)."""
    try:
        huggingface_folder.quiet_transformers()
    except ImportError as error:
        raise UsageError(str(error)) from error


def text_model_folder(name: str, option: str = "--model") -> Path:
    """`option`'s model (`--model`, `--guide`, `MODEL`): the packaged all-MiniLM-L6-v2, or a local Hugging Face
    model folder; UsageError naming `option` when the package it needs is missing."""
    try:
        return huggingface_folder.model_folder(name)
    except ImportError as error:
        raise UsageError(f"{option} {error}") from error


def check_text_folder(option: str, name: str, pooling: str | None, max_length: int) -> None:
    """`option`'s model folder and its tokenizer load offline and belong together (UsageError naming `option`), and
    `--max-length` is within the positions its model embeds (`check_positions`)."""
    folder = text_model_folder(name, option)
    quiet_transformers()
    try:
        huggingface_folder.check_model_folder(folder, pooling, max_length)
    except (ValueError, OSError) as error:
        raise UsageError(f"{option} {name}: {error}") from error
    check_positions("--max-length", max_length, option, name)


def check_positions(length_option: str, length: int | None, option: str, name: str) -> None:
    """`length_option`'s `length` (tokens per text: `--max-length`, `--query-expansion`) at most the positions the
    model of `option`'s folder `name` embeds (its config.json's max_position_embeddings), else UsageError naming
    both options, the bound and the fix; nothing is tokenised to that length first. None: nothing to check."""
    from gradcache.models.hf_tokenizer import tokenizer_folder
    from gradcache.models.model_positions import check_tokens

    if length is None:
        return
    try:
        check_tokens(length, length_option, tokenizer_folder(text_model_folder(name, option))[0])
    except ValueError as error:
        raise UsageError(f"{error} (the model of {option} {name})") from error


def text_tokenizer(config: RunConfig, model: str | None = None) -> HuggingFaceTokenizer:
    """The tokenizer of `--model` (or of `model`, e.g. the guide's folder), truncating at `--max-length`."""
    return HuggingFaceTokenizer(text_model_folder(config.model if model is None else model), config.max_length)


def query_expansion(config: RunConfig) -> QueryExpansion | None:
    """`--query-expansion` and `--attend-to-expansion` (--kind multi-vector): how queries are expanded, or None."""
    if config.query_expansion is None:
        return None
    return QueryExpansion(config.query_expansion, config.attend_to_expansion)


def side_tokenizers(config: RunConfig) -> tuple[Callable, Callable]:
    """The tokenizers of queries and of passages: `--model`'s, each text after its side's prompt, queries expanded
    by `--query-expansion` (UsageError for a tokenizer that cannot expand them); passages never are."""
    tokenizer = text_tokenizer(config)
    try:
        query = tokenizer.with_prompt(config.query_prompt, query_expansion(config))
    except ValueError as error:
        raise UsageError(f"--query-expansion {config.query_expansion}: {error}") from error
    return query, tokenizer.with_prompt(config.passage_prompt)


def load_text_folder(kind: Mode, request: ModelRequest, folder: Path, passage_folder: Path | None = None
                     ) -> LoadedModel:
    """A shared tower from `folder`, or a query tower from `folder` and a passage tower from `passage_folder`
    (both with `folder`'s tokenizer); the request's prompts where given, else the folder's own."""
    from gradcache.models import BiEncoder, HuggingFaceEncoder
    from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
    from gradcache.train.modes.loaded_model import LoadedModel

    quiet_transformers()
    request.check_max_length(folder)
    try:
        layout = read_sentence_transformer_folder(folder)
        # the length the folder says it was trained with (sentence-transformers' max_seq_length), else train's
        length = request.max_length or (layout and layout.max_seq_length) or RunConfig.max_length
        tokenizer = HuggingFaceTokenizer(folder, length)  # before the weights: a tokenizer of another model is refused
        encoder = HuggingFaceEncoder(folder, pooling=request.pooling)
        passage = None if passage_folder is None else HuggingFaceEncoder(passage_folder, pooling=request.pooling)
    except (ValueError, OSError) as error:
        raise UsageError(f"MODEL {request.name}: {error}") from error
    prompts = request.prompts if layout is None else request.prompts_or(layout.query_prompt, layout.passage_prompt)
    model = BiEncoder(encoder, passage).to(request.device).eval()
    return LoadedModel(kind, f"model folder {folder}", model, request.device, tokenizer=tokenizer,
                       encode_query=model.encode_query, encode_passage=model.encode_passage,
                       query_prompt=prompts[0], passage_prompt=prompts[1])
