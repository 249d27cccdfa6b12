"""A local Hugging Face model folder's own tokenizer, as a callable from texts to padded id and mask tensors."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

# A generous bound on the characters one token covers (English text averages about 4). The tokenizer reads a text
# whole before it truncates it, so each text is first cut to max_length x this many characters: a row of hundreds
# of megabytes would otherwise exhaust memory (the Rust tokenizer aborts the process), and the tokens kept are
# those of the whole text, unless a text's first max_length tokens span more than that (runs of whitespace longer
# than this bound between them).
CHARACTERS_PER_TOKEN = 64

# Files of which a folder needs at least one to hold a tokenizer's vocabulary. Without any, transformers 5 builds
# an empty tokenizer of special tokens alone instead of failing, and every text would become [CLS] [UNK] ... [SEP].
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


class HuggingFaceTokenizer:
    """texts -> ``{"input_ids": (B, L), "attention_mask": (B, L)}`` int64, by the folder's own ``AutoTokenizer``.

    L is the longest text of the batch after truncation to ``max_length`` tokens (special tokens included), so a
    batch is padded only as far as it needs. A text is cut to ``max_length * CHARACTERS_PER_TOKEN`` characters
    before the tokenizer reads it, so a huge text costs no more than an ordinary long one. ``token_type_ids`` is
    left out: one-segment inputs take its default. A sentence-transformers folder's tokenizer is read from its ``Transformer`` module's path.

    Args:
        path: a local model folder (``save_pretrained`` of a model and its tokenizer).
        max_length: the most tokens per text, at least 2.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``max_length`` below 2, or no tokenizer in the folder that loads without the network.

    Example:
        >>> tokenize = HuggingFaceTokenizer("/data/tiny-bert", max_length=32)
        >>> tokenize(["a query", "a longer passage"])["input_ids"].shape  # (2, L), L <= 32
    """

    def __init__(self, path: str | os.PathLike, max_length: int = 128) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length={max_length!r} must be an int of at least 2 (two special tokens).")
        try:
            import transformers
        except ImportError as error:
            raise ImportError('HuggingFaceTokenizer needs the transformers package: pip install -e ".[hf]"') from error
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"path={str(folder)!r} is not a directory; give a local model folder")
        layout = read_sentence_transformer_folder(folder)
        folder = folder if layout is None else layout.model_path
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                             "model's tokenizer there with tokenizer.save_pretrained(folder)")
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(folder), local_files_only=True)
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"the tokenizer in {folder} does not load without the network: {error}") from error
        self.max_length = max_length

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``, added tokens included."""
        return len(self.tokenizer)

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts must be a list of str, got {type(texts).__name__}; wrap a single text as [text].")
        kept = self.max_length * CHARACTERS_PER_TOKEN
        texts = [text[:kept] if isinstance(text, str) else text for text in texts]
        batch = self.tokenizer(texts, padding="longest", truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
