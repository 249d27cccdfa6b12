"""A local Hugging Face model folder's own tokenizer, as a callable from texts (and a prompt) to padded id and mask
tensors; `end_with_eos` is the one place that decides whether a text ends with the EOS token."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gradcache.models.huggingface import config_validation_errors
from gradcache.models.multi_vector_folder import is_multi_vector_folder, read_multi_vector_folder
from gradcache.models.query_expansion import QueryExpansion
from gradcache.models.sentence_transformers_folder import (
    lower_cases,
    read_sentence_transformer_folder,
    transformer_config,
)
from gradcache.models.tokenizer_match import check_tokenizer_model, is_panic
from gradcache.ranges import is_int

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


def end_with_eos(tokenizer: Any) -> None:
    """Make `tokenizer` (a transformers tokenizer) end every text with its EOS token when it has one and does not
    add it itself, as the E5-Mistral and Qwen3-Embedding recipes do, so that last-token pooling reads the EOS
    token's hidden state; and pad with the EOS token when it has no padding token (Llama's, Mistral's).

    The EOS token is added by the tokenizer's own post-processor (after what it already adds, e.g. a BOS token),
    so truncation keeps it, and ``save_pretrained`` writes it: a folder exported with this tokenizer tokenises the
    same in sentence-transformers. A tokenizer without an EOS token (BERT's) is left as it is: the last token is
    what it adds itself (``[SEP]``). A tokenizer that already ends texts with EOS is left as it is too.

    Raises:
        ValueError: it has no padding token and no EOS token to pad with, or it must append EOS but is not a
            fast tokenizer (no ``tokenizer.json`` post-processor to add it by), or its post-processor cannot be
            followed by one (the tokenizers library panics: the tokenizer is left as it was).
    """
    eos = tokenizer.eos_token
    if tokenizer.pad_token is None:
        if eos is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has neither a padding nor an EOS token, so "
                             "batches cannot be padded; set tokenizer.pad_token and save it with save_pretrained")
        tokenizer.pad_token = eos
    if eos is None or tokenizer("a")["input_ids"][-1:] == [tokenizer.eos_token_id]:
        return
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"the tokenizer {type(tokenizer).__name__} has the EOS token {eos!r} but does not append "
                         "it, and is not a fast tokenizer that this program can make append it; save a fast one "
                         "(tokenizer.json) with save_pretrained")
    from tokenizers import processors

    before, existing = tokenizer("a")["input_ids"], backend.post_processor
    if hasattr(type(tokenizer), "add_eos_token"):  # transformers' own switch, which its tokenizer classes save
        tokenizer.add_eos_token = True
        if tokenizer("a")["input_ids"] == before + [tokenizer.eos_token_id]:
            return
        object.__setattr__(tokenizer, "_add_eos_token", False)  # it rebuilt the template without what it added
        backend.post_processor = existing
    append = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A $B {eos}",
                                           special_tokens=[(eos, tokenizer.eos_token_id)])
    backend.post_processor = append if existing is None else processors.Sequence([existing, append])
    try:  # the tokenizers library cannot follow every template by another: it panics at the first text
        tokenizer("a")
    except BaseException as error:
        if not is_panic(error):
            raise
        backend.post_processor = existing
        raise ValueError(f"the tokenizer {type(tokenizer).__name__} does not append its EOS token {eos!r}, and its "
                         f"post-processor cannot be followed by one that does (the tokenizers library fails: "
                         f"{error}); save a tokenizer that ends texts with its EOS token itself, or one without an "
                         "EOS token") from error


def tokenizer_folder(folder: Path) -> tuple[Path, bool]:
    """Where the tokenizer of the model folder `folder` lies (a sentence-transformers folder's `Transformer` path),
    and whether texts are lower-cased before it reads them (its `sentence_bert_config.json`'s `do_lower_case`)."""
    if is_multi_vector_folder(folder):  # a MultiVectorEncoder's tokenizer lies in its Transformer's folder
        model_path = read_multi_vector_folder(folder).model_path
        return model_path, lower_cases(*transformer_config(model_path, folder))
    layout = read_sentence_transformer_folder(folder)
    return (folder, False) if layout is None else (layout.model_path, layout.do_lower_case)


def lower_case_texts(tokenizer: Any) -> None:
    """Make `tokenizer` lower-case every text (prompts included) before it splits it, as sentence-transformers'
    `Transformer(do_lower_case=True)` does when it loads a folder: a `Lowercase` normaliser first in a fast
    tokenizer's own normaliser, else the slow tokenizer's `do_lower_case`. A tokenizer reloaded from what
    `save_pretrained` writes does not lower-case: an export writes `do_lower_case` into its folder instead."""
    if not getattr(tokenizer, "is_fast", False):
        try:
            tokenizer.do_lower_case = True
        except AttributeError:  # a property without a setter: its basic tokenizer's switch
            tokenizer.basic_tokenizer.do_lower_case = True
        return
    from tokenizers.normalizers import Lowercase, Sequence

    backend = tokenizer.backend_tokenizer
    existing = backend.normalizer
    parts = list(existing) if isinstance(existing, Sequence) else [] if existing is None else [existing]
    if not any(isinstance(part, Lowercase) for part in parts):
        backend.normalizer = Sequence([Lowercase(), *parts])


class HuggingFaceTokenizer:
    """texts -> ``{"input_ids": (B, L), "attention_mask": (B, L)}`` int64, by the folder's own ``AutoTokenizer``;
    with a ``prompt``, ``prompt + text`` for each text, and ``"prompt_length"`` (B,): the prompt's tokens.

    L is the longest text of the batch after truncation to ``max_length`` tokens (special tokens included), so a
    batch is padded only as far as it needs. A text is cut to ``max_length * CHARACTERS_PER_TOKEN`` characters
    before the tokenizer reads it, so a huge text costs no more than an ordinary long one. ``token_type_ids`` is
    left out: one-segment inputs take its default. A sentence-transformers folder's tokenizer is read from its
    ``Transformer`` module's path; it lower-cases texts where the folder's ``sentence_bert_config.json`` says
    ``do_lower_case`` (``lower_case_texts``). Each text ends with the EOS token where ``end_with_eos`` says so.

    ``prompt_length`` counts the tokens of the prompt tokenised alone, less a trailing special token (EOS, SEP):
    its leading special token (BOS, CLS) and its words, as sentence-transformers counts it for
    ``Pooling(include_prompt=False)``. ``HuggingFaceEncoder(include_prompt=False)`` leaves them out of mean pooling.

    With an ``expansion`` (``QueryExpansion``: ColBERT's query expansion, sentence-transformers' strategy "fixed"),
    every text is exactly ``expansion.length`` tokens instead (``max_length`` is not read): truncated there, or
    padded there and the padding replaced by the mask token, marked in ``"query_expansion_positions"`` (B, L) bool,
    as ``MultiVectorEncoder.preprocess(texts, task="query")`` tokenises queries.

    Args:
        path: a local model folder (``save_pretrained`` of a model and its tokenizer).
        max_length: the most tokens per text, at least 2.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``max_length`` below 2, or no tokenizer in the folder that loads without the network, or one
            that ``end_with_eos`` cannot complete, or one of another model (``check_tokenizer_model``: a BERT
            tokenizer in a Qwen2 folder); an empty ``prompt`` (give None for no prompt); an ``expansion``
            with a tokenizer that has neither a mask nor an EOS token.

    Example:
        >>> tokenize = HuggingFaceTokenizer("/data/tiny-bert", max_length=32)
        >>> tokenize(["a query", "a longer passage"])["input_ids"].shape  # (2, L), L <= 32
        >>> tokenize(["who bakes bread?"], prompt="query: ")["prompt_length"]  # tensor([3]): [CLS] query :
    """

    def __init__(self, path: str | os.PathLike, max_length: int = 128) -> None:
        if not is_int(max_length, 2):
            raise ValueError(f"max_length={max_length!r} must be an int of at least 2 (two special tokens).")
        try:
            import transformers
        except ImportError as error:
            raise ImportError('HuggingFaceTokenizer needs the transformers package: pip install -e ".[hf]"') from error
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"path={str(folder)!r} is not a directory; give a local model folder")
        folder, lower_case = tokenizer_folder(folder)
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                             "model's tokenizer there with tokenizer.save_pretrained(folder)")
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(folder), local_files_only=True)
        except config_validation_errors() as error:  # transformers reads config.json to pick the class
            cause = " ".join(str(error).split())  # a validation error spans lines: one line, for a one-line message
            raise ValueError(f"the config.json of {folder} holds a value of the wrong type ({cause}); the folder "
                             "was edited: restore the value, or save the model again") from error
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"the tokenizer in {folder} does not load without the network: {error}") from error
        check_tokenizer_model(self.tokenizer, folder)  # another model's class over the folder's vocabulary
        if lower_case:
            lower_case_texts(self.tokenizer)
        try:
            end_with_eos(self.tokenizer)
        except ValueError as error:
            raise ValueError(f"the tokenizer in {folder}: {error}") from error
        self.max_length = max_length
        self._prompt_lengths: dict[str, int] = {}

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``, added tokens included."""
        return len(self.tokenizer)

    def with_prompt(self, prompt: str | None, expansion: QueryExpansion | None = None
                    ) -> Callable[[list[str]], dict[str, torch.Tensor]]:
        """texts -> this tokenizer's tokens of ``prompt + text`` (itself for None), expanded by ``expansion`` where
        given: one side's tokenizer."""
        check_prompt(prompt, "prompt")
        if expansion is not None:
            expansion.token_id(self.tokenizer)  # ValueError now, not at the first batch
            return functools.partial(self, prompt=prompt, expansion=expansion)
        return self if prompt is None else functools.partial(self, prompt=prompt)

    def prompt_length(self, prompt: str) -> int:
        """The tokens of `prompt` (class docstring), counted once per prompt."""
        if prompt not in self._prompt_lengths:
            ids = self.tokenizer([prompt], truncation=True, max_length=self.max_length)["input_ids"][0]
            special = set(self.tokenizer.all_special_ids)
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in special else 0)
        return self._prompt_lengths[prompt]

    def __call__(self, texts: list[str], prompt: str | None = None,
                 expansion: QueryExpansion | None = None) -> dict[str, torch.Tensor]:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts must be a list of str, got {type(texts).__name__}; wrap a single text as [text].")
        check_prompt(prompt, "prompt")
        length = self.max_length if expansion is None else expansion.length
        texts = [text[:length * CHARACTERS_PER_TOKEN] if isinstance(text, str) else text for text in texts]
        if prompt is not None:
            texts = [prompt + text if isinstance(text, str) else text for text in texts]
        batch = self.tokenizer(texts, padding="longest" if expansion is None else "max_length", truncation=True,
                               max_length=length, return_tensors="pt")
        tokens = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}  # (B, L)
        if expansion is not None:
            tokens = expansion.expand(tokens, expansion.token_id(self.tokenizer))
        if prompt is not None:
            tokens["prompt_length"] = torch.full((len(texts),), self.prompt_length(prompt), dtype=torch.long)  # (B,)
        return tokens


def check_prompt(prompt: str | None, name: str) -> None:
    """A prompt is None (none) or a non-empty str; TypeError or ValueError naming `name` otherwise."""
    if prompt is None:
        return
    if not isinstance(prompt, str):
        raise TypeError(f"{name} must be a str or None, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError(f"{name}='' is empty; give None (no prompt) or the text to prepend, e.g. 'query: '")
