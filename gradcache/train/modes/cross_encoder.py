"""`gradcache train text --kind cross-encoder`: a reranker, one score per (query, passage) pair read together.

The model is `--model` as `AutoModelForSequenceClassification` with one label (a base model folder gets a new
head, initialised as transformers initialises it), its pairs tokenised per chunk inside the encoder
(`gradcache.PairScorer`). Each query's group is its positive, `--in-batch-negatives` candidates of the other rows
of the batch and its h hard negatives, and the loss is the listwise cross-entropy over the group's Sigmoid scores
divided by `--temperature`: sentence-transformers' cross-encoder `CachedMultipleNegativesRankingLoss` (whose
`num_negatives` is 4 and whose `scale` is 1 / temperature), the peer's training by default
(gradcache/train/data/text/rerank_groups.py). Scored by reranking each held-out query's candidates
(gradcache/train/eval/reranking.py); exported as a sentence-transformers `CrossEncoder` folder
(gradcache/train/export/cross_encoder.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import distributed
from gradcache.losses import ListwiseRerank
from gradcache.models.cross_encoder import HuggingFaceCrossEncoder, weights_folder
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.rerank_groups import group_size, rerank_batches
from gradcache.train.data.text.streamed_rows import StreamedRows
from gradcache.train.data.text.text_pairs import TextSplits
from gradcache.train.errors import UsageError
from gradcache.train.eval.reranking import evaluate_reranking
from gradcache.train.export.cross_encoder import SIGMOID, write_cross_encoder_folder
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import OptionGroups
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.text import Text
from gradcache.train.modes.grouped_rerank import GroupedRerank
from gradcache.train.modes.head_weights import listed, missing_head
from gradcache.train.modes.text_folders import check_text_folder, quiet_transformers, text_model_folder
from gradcache.train.modes.text_lengths import check_pair_lengths


IDENTITY = "torch.nn.modules.linear.Identity"  # the other activation_fn these commands apply


class CrossEncoderText(Text):
    kind = "cross-encoder"
    kind_help = ("a reranker: one score per (query, passage) pair read together (a sentence-transformers "
                 "CrossEncoder), listwise loss over each query's positive, in-batch and hard negatives")
    negatives_loss = ListwiseRerank()  # counts G - 1 negatives: hard_negatives() says G - 1
    kind_fields = ("in_batch_negatives",)
    kind_defaults = {"temperature": 0.1}  # CachedMultipleNegativesRankingLoss's scale 10
    refused = {  # the dense kind's options a cross-encoder cannot honour (Text.check)
        "separate_towers": "one model reads the query and the passage together",
        "symmetric": "a pair has one score, not a direction",
        "guide": "the guide filters a dense InfoNCE's candidates",
        "pooling": "the classification head reads the model's own pooled output",
        "query_prompt": "the pairs are tokenised without prompts",
        "passage_prompt": "the pairs are tokenised without prompts",
        "exclude_prompt_from_pooling": "there is no pooling or prompt",
        "lora_rank": "LoRA adapts the dense towers only",
        "lora_alpha": "LoRA adapts the dense towers only",
        "lora_dropout": "LoRA adapts the dense towers only",
        "lora_targets": "LoRA adapts the dense towers only",
        "matryoshka_dims": "a score has one dimension",
        "queue_size": "a queued score belongs to another query's pair",
        "tile_size": "the listwise loss holds one score per pair, nothing to tile",
        "chunk_tokens": "the pairs are tokenised inside the encoder, chunk by chunk",
        "fsdp": "the sharded placements wrap the dense encoders only",
        "deepspeed": "the sharded placements wrap the dense encoders only",
    }
    ranks_passages = False  # it scores pairs: eval reranks each row's candidates (`LoadedModel.score_pairs`)
    mines = False
    folder_formats = (ModelFolderFormat.CROSS_ENCODER,)
    folder_description = "cross-encoder folder (a sentence-transformers CrossEncoder)"

    def add_kind_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        groups.run.add_argument(
            "--in-batch-negatives", type=int, default=default("in_batch_negatives"),
            help="--kind cross-encoder: candidates of the batch's other rows added to each query's group, drawn "
                 "without replacement per step (sentence-transformers' num_negatives); all of them when there are "
                 "fewer; 0: each query's positive and hard negatives alone")

    def check_model(self, config: RunConfig) -> None:
        """The model folder and its tokenizer load offline and belong together (weights not loaded)."""
        self.check_folder_format(config.model)
        check_text_folder("--model", config.model, None, config.max_length)

    def random_heads(self, config: RunConfig) -> list[str]:
        """The sequence-classification head, when `--model`'s weights hold none of it (a base encoder rather
        than a reranker): transformers initialises it at random, as sentence-transformers' CrossEncoder does."""
        folder = weights_folder(text_model_folder(config.model))
        head = missing_head(folder, "AutoModelForSequenceClassification")
        if not head:
            return []
        return [f"--model {config.model} ({folder}) has no sequence-classification head (none of {listed(head)}): "
                "--kind cross-encoder trains its scoring layer from random initialisation, so the step-0 scores "
                "are chance; expected from a base encoder, and a folder saved from a trained reranker starts "
                "from its own"]

    def embedding_width(self, config: RunConfig) -> int:
        return 1  # one score per pair

    # --- data -------------------------------------------------------------------------------------------
    def resolve(self, config: RunConfig, data: TextSplits) -> RunConfig:
        """h from the data; streamed rows and groups of one pair refused (UsageError)."""
        if isinstance(data.train, StreamedRows):
            raise UsageError(f"--kind cross-encoder draws each step's in-batch negatives by the rows' places, which "
                             f"a streamed --data {config.data} (.jsonl.gz) does not have; decompress it to .jsonl "
                             "(indexed, not streamed), or train --kind dense")
        config = super().resolve(config, data)
        if group_size(config.in_batch_negatives, config.negatives_per_query, self._rows(config)) < 2:
            raise UsageError(f"--in-batch-negatives {config.in_batch_negatives} with {config.negatives_per_query} "
                             "hard negatives per query leaves each query its positive alone, nothing to rank it "
                             "against; give --in-batch-negatives of at least 1, or rows with hard negatives")
        return config

    def check_lengths(self, config: RunConfig, data: TextSplits) -> None:
        """`--max-length` leaves a sample of the rows' (query, passage) pairs text of both (modes/text_lengths.py),
        tokenised by the model folder's own tokenizer as the encoder tokenises them."""
        import transformers

        source = weights_folder(text_model_folder(config.model))
        quiet_transformers()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        check_pair_lengths(config, data, tokenizer)

    def batches(self, config: RunConfig, data: TextSplits, sampler: StepSampler) -> DataLoader:
        return rerank_batches(data.train, sampler, config.in_batch_negatives, config.workers)

    @staticmethod
    def _rows(config: RunConfig) -> int:
        """Rows of one rank's batch: the in-batch negatives are drawn among them."""
        return config.batch_size // distributed.world_size()

    def group_size(self, config: RunConfig) -> int:
        """G = 1 + k + h pairs per query (rerank_groups.py)."""
        return group_size(config.in_batch_negatives, config.negatives_per_query or 0, self._rows(config))

    def hard_negatives(self, config: RunConfig) -> int:
        return self.group_size(config) - 1

    def chunk_sizes(self, config: RunConfig) -> int:
        """--chunk-size queries' groups per chunk: c G pairs (whole groups, so `naive` micro-batches hold them)."""
        return config.chunk_size * self.group_size(config)

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        folder = text_model_folder(config.model)
        quiet_transformers()
        try:
            return HuggingFaceCrossEncoder(folder, config.max_length)
        except ValueError as error:
            raise UsageError(f"--model {config.model}: {error}") from error

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """Nothing to say: no adapter."""

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedRerank(self.group_size(config), config.temperature)

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module:
        return model

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: TextSplits,
                device: torch.device) -> dict[str, float]:
        return evaluate_reranking(model, data.test, seed=config.data_seed)

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    @property
    def model_noun(self) -> str:
        return self.kind

    def loaded_from_run(self, request: ModelRequest, run: Path, config: RunConfig, model: nn.Module,
                        meta, source: str) -> LoadedModel:
        """The run's `PairScorer`: (query, passage) pairs, tokenised by it at the run's --max-length (or the
        request's), to logits."""
        request.check_max_length(text_model_folder(config.model, "MODEL"))
        model.max_length = request.max_length or model.max_length
        return LoadedModel(self, source, model, request.device, config=config, meta=meta, score_pairs=model)

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """A sentence-transformers CrossEncoder folder (a `--kind cross-encoder` export): its logits, truncated as
        `CrossEncoder` truncates (the tokenizer's model_max_length, at most the model's positions: `pair_length`;
        a --max-length within those positions), and its activation (Sigmoid or Identity, from
        config_sentence_transformers.json), each value checked before the model loads."""
        from gradcache.models.cross_encoder import pair_length
        from gradcache.models.sentence_transformers_folder import read_json_object

        name = request.name
        if request.pooling is not None or request.prompts != (None, None):
            raise UsageError(f"MODEL {name} is a cross-encoder folder: it reads each (query, passage) pair whole, "
                             "without pooling or prompts (drop --pooling, --query-prompt and --passage-prompt)")
        path = folder / "config_sentence_transformers.json"
        activations = {SIGMOID: torch.sigmoid, IDENTITY: lambda scores: scores}
        try:
            activation = read_json_object(path).get("activation_fn", SIGMOID)
        except ValueError as error:
            raise UsageError(f"MODEL {name}: {error}") from error
        if not isinstance(activation, str) or activation not in activations:
            raise UsageError(f"MODEL {name}: {path}: activation_fn {activation!r} is neither {SIGMOID!r} nor "
                             f"{IDENTITY!r}, the two these commands apply; fix the key, or score it with "
                             "sentence_transformers.CrossEncoder")
        request.check_max_length(folder)
        try:
            quiet_transformers()
            length = request.max_length or pair_length(folder)  # before the model loads: a tampered length first
            scorer = HuggingFaceCrossEncoder(folder, length)
        except (ImportError, ValueError, OSError) as error:
            raise UsageError(f"MODEL {name}: {error}") from error
        scorer = scorer.to(request.device).eval()
        return LoadedModel(self, f"cross-encoder folder {folder}", scorer, request.device, score_pairs=scorer,
                           activation=activations[activation])

    # --- export -----------------------------------------------------------------------------------------
    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A sentence-transformers CrossEncoder folder: `CrossEncoder(folder).predict` gives the run's scores."""
        write_cross_encoder_folder(model, text_model_folder(config.model), config.max_length, folder)
