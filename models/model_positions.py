"""How many tokens a Hugging Face model folder embeds positions for, and the check that a length read from a
folder's JSON or given as an option is a whole number of tokens within them, before anything of that length is
tokenised, padded or allocated (a tampered `max_seq_length` of 10**9, a query expansion padding every query to it,
a `--max-length` beyond a BERT's 512 positions that fails at the first long text).

The bound is the model's `config.json` `max_position_embeddings` (`n_positions` for GPT-2's), read as plain JSON:
a folder whose config says none has no bound here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from gradcache.ranges import is_int

POSITION_KEYS = ("max_position_embeddings", "n_positions")  # the first one config.json holds is read


def max_positions(model_folder: str | os.PathLike) -> int | None:
    """The positions the model of `model_folder` (the folder holding its config.json) embeds; None where its
    config.json is absent or names none (`-1`, transformers' "unbounded", included).

    Raises:
        ValueError: config.json is not a JSON object, or its positions are not a whole number (naming the file and
            the key).
    """
    path = Path(model_folder) / "config.json"
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(values).__name__}; save the model again")
    for key in POSITION_KEYS:
        value = values.get(key)
        if value is None or value == -1:
            continue
        if not is_int(value, 1):
            raise ValueError(f"{path}: {key} {value!r} is not a positive whole number of positions; the folder was "
                             "edited: save the model again, or restore the key")
        return value
    return None


def check_tokens(value: object, name: str, model_folder: str | os.PathLike, least: int = 2) -> int:
    """`value` itself when it is an int from `least` to the positions of `model_folder`'s model (`max_positions`),
    else ValueError (a value that is not an int too: a file's value of the wrong type) whose message begins with
    `name` (an option, "--max-length", or a file and its key, "FOLDER/sentence_bert_config.json: max_seq_length")
    and says the bound and the fix."""
    if not is_int(value):
        raise ValueError(f"{name} {value!r} is not a whole number of tokens; give one from {least} on")
    if value < least:
        raise ValueError(f"{name} {value} is below {least}, the fewest tokens that hold a text's special tokens; "
                         f"give at least {least}")
    positions = max_positions(model_folder)
    if positions is not None and value > positions:
        source = Path(model_folder) / "config.json"
        raise ValueError(f"{name} {value} exceeds the {positions} positions the model embeds ({source}: "
                         f"max_position_embeddings); give at most {positions}")
    return value
