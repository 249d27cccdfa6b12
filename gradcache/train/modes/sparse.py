"""`gradcache train text --kind sparse`: SPLADE. A masked-language model's logits, max-pooled over the tokens as
log(1 + relu(.)), give each text a nonnegative vocabulary-sized row (gradcache.models.splade); queries rank
passages by dot product; the loss is InfoNCE over those dot products at `--temperature` plus the FLOPS
regularisers of the passages and of the queries (gradcache.losses.SpladeLoss), GradCache caching the rows by
their non-zeros (`sparse_cache`, exact for these rows). Scored by sparse retrieval of the held-out queries'
passages, exported as a sentence-transformers `SparseEncoder` folder. The same rows, data formats, strategies
and resume as the dense kind (modes/text.py), whose options this kind cannot honour it refuses."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache import losses
from gradcache.losses.sparse_scores import take_rows
from gradcache.models import BiEncoder, HuggingFaceTokenizer
from gradcache.models.sentence_transformers_folder import SPLADE_POOLING, read_sentence_transformer_folder
from gradcache.models.splade import SpladeEncoder
from gradcache.sparse_rows import SparseRows
from gradcache.token_embeddings import row_count
from gradcache.train.config import RunConfig
from gradcache.train.data.text.batches import split_groups
from gradcache.train.data.text.text_pairs import TextSplits
from gradcache.train.errors import UsageError
from gradcache.train.eval.representations import SPARSE_ROWS
from gradcache.train.eval.sparse_retrieval import evaluate_sparse_retrieval
from gradcache.train.export.sparse_encoder import write_sparse_encoder_folder
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import OptionGroups
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.text import Text
from gradcache.train.modes.head_weights import listed, missing_head
from gradcache.train.modes.text_folders import check_text_folder, quiet_transformers, side_tokenizers, text_model_folder

LOSS_PARTS = ("base_loss", "document_regularizer_loss", "query_regularizer_loss")  # SpladeLoss.parts


class GroupedSpladeLoss(nn.Module):
    """SpladeLoss(query (n, V), passages (n (1 + h), V) grouped by query, positive first): InfoNCE of every query
    against every positive and hard negative of the batch by dot product / temperature, plus
    lambda_d FLOPS(passages) + lambda_q FLOPS(queries), over all ranks when the strategy gathers them. `parts`
    holds the last call's three terms (weighted, detached)."""

    def __init__(self, negatives_per_query: int, temperature: float, document_regularizer_weight: float,
                 query_regularizer_weight: float) -> None:
        super().__init__()
        self.negatives_per_query = negatives_per_query
        self.splade = losses.SpladeLoss(losses.InfoNCE(temperature=temperature, similarity="dot"),
                                        document_regularizer_weight, query_regularizer_weight)

    @property
    def temperature(self) -> float:
        return self.splade.loss.temperature

    @property
    def parts(self) -> dict[str, torch.Tensor]:
        return self.splade.parts

    takes_sparse_rows = True  # as SpladeLoss: the sparse cache's rows by their non-zeros

    def forward(self, query: torch.Tensor | SparseRows, passages: torch.Tensor | SparseRows) -> torch.Tensor:
        n, rows = row_count(query), row_count(passages)
        if rows != n * (1 + self.negatives_per_query):
            raise ValueError(f"passages must hold {1 + self.negatives_per_query} rows per query (positive and "
                             f"{self.negatives_per_query} hard negatives), got {rows} for {n} queries")
        if isinstance(passages, SparseRows):  # the rows of each group, by their non-zeros
            first = torch.arange(0, rows, 1 + self.negatives_per_query, device=passages.values.device)
            others = torch.ones(rows, dtype=torch.bool, device=first.device)
            others[first] = False
            negatives = take_rows(passages, others.nonzero().squeeze(1)) if self.negatives_per_query else None
            return self.splade(query, take_rows(passages, first), negatives)
        positive, negatives = split_groups(passages, self.negatives_per_query)  # (n, V), (n h, V) or None
        return self.splade(query, positive, negatives)


class SparseText(Text):
    """Text retrieval with a SPLADE model: the dense kind (`Text`) with its model, loss, evaluation and export
    replaced (module docstring)."""

    kind = "sparse"
    kind_help = ("SPLADE: one sparse vocabulary-sized row per text from a masked-language model, dot product, "
                 "FLOPS regularisers (a sentence-transformers SparseEncoder)")
    kind_fields = ("document_regularizer_weight", "query_regularizer_weight")
    sparse_cache = True  # max-pooled log(1 + relu(.)) rows: 0 only where relu clamps, so exact
    kind_defaults = {"temperature": 1.0}  # SparseMultipleNegativesRankingLoss's scale 1
    refused = {  # the dense kind's options a SPLADE run cannot honour (Text.check)
        "guide": "GIST's guide filters InfoNCE over cosine similarities",
        "matryoshka_dims": "a SPLADE row's columns are vocabulary entries, not nested widths",
        "queue_size": "the FLOPS regularisers are over the batch's rows, not a queue's",
        "tile_size": "the rows are scored whole",
        "symmetric": "SPLADE's loss ranks passages for queries only",
        "pooling": "SPLADE max-pools log(1 + relu(logits)) over the tokens",
        "exclude_prompt_from_pooling": "SPLADE pools every token, as sentence-transformers' SpladePooling",
        "separate_towers": "one SPLADE encoder embeds queries and passages (a SparseEncoder folder)",
        "chunk_tokens": "the sparse cache keeps the rows in chunk order: use --chunk-size",
        "lora_rank": "LoRA adapters are not placed on the masked-language-model head",
    }
    text_embeddings = SPARSE_ROWS
    mines = False  # mine ranks by dense embeddings
    folder_formats = (ModelFolderFormat.SPARSE_ENCODER,)
    folder_description = "SparseEncoder folder (SPLADE pooling)"

    def add_kind_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        groups.run.add_argument("--document-regularizer-weight", type=float,
                                default=default("document_regularizer_weight"),
                                help="--kind sparse: lambda_d, the weight of the FLOPS regulariser of the passages "
                                "(positives and hard negatives)")
        groups.run.add_argument("--query-regularizer-weight", type=float, default=default("query_regularizer_weight"),
                                help="--kind sparse: lambda_q, the weight of the FLOPS regulariser of the queries")

    def check_model(self, config: RunConfig) -> None:
        """The folder (a Hugging Face or a sentence-transformers folder, a SparseEncoder one included) and its
        tokenizer load offline and belong together, and its configuration has a masked-language-model class."""
        self.check_folder_format(config.model)
        check_text_folder("--model", config.model, SPLADE_POOLING, config.max_length)
        import transformers

        model_config = transformers.AutoConfig.from_pretrained(_transformer_folder(config), local_files_only=True)
        if type(model_config) not in transformers.MODEL_FOR_MASKED_LM_MAPPING:
            raise UsageError(f"--model {config.model} is a {model_config.model_type!r} model, which has no "
                             "masked-language-model head (AutoModelForMaskedLM); --kind sparse needs an encoder "
                             "with one (BERT, DistilBERT, RoBERTa, ModernBERT ...): give such a folder, or train "
                             "--kind dense")

    def random_heads(self, config: RunConfig) -> list[str]:
        """The masked-language-model head, when `--model`'s weights hold none of it (a plain encoder such as the
        packaged MiniLM): SPLADE's rows are that head's logits, and transformers would initialise it at random."""
        folder = _transformer_folder(config)
        head = missing_head(folder, "AutoModelForMaskedLM")
        if not head:
            return []
        return [f"--model {config.model} ({folder}) has no masked-language-model head (none of {listed(head)}): "
                "--kind sparse would train one from random initialisation, "
                "its rows near-dense and its retrieval no better than before; give a folder saved from an "
                "*ForMaskedLM model (e.g. a BERT or DistilBERT checkpoint with its MLM head, or a SPLADE model)"]

    def embedding_width(self, config: RunConfig) -> int:
        """The vocabulary size (config.json, read without loading the weights)."""
        import transformers

        return transformers.AutoConfig.from_pretrained(_transformer_folder(config), local_files_only=True).vocab_size

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        """One SPLADE encoder for queries and passages; a folder without an MLM head gets one initialised."""
        folder = text_model_folder(config.model)
        quiet_transformers()
        try:
            return BiEncoder(SpladeEncoder(folder))
        except ValueError as error:
            raise UsageError(f"--model {config.model}: {error}") from error

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """Nothing to say: the MLM head a folder lacks is initialised in `build_model`, as transformers does."""

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedSpladeLoss(self.hard_negatives(config), config.temperature, config.document_regularizer_weight,
                                 config.query_regularizer_weight)

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module:
        return model.query_tower

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: TextSplits,
                device: torch.device) -> dict[str, float]:
        corpus = None if data.corpus is None else (data.corpus, data.test_positions)
        query_tokenizer, passage_tokenizer = side_tokenizers(config)
        return evaluate_sparse_retrieval(model.encode_query, model.encode_passage, query_tokenizer, passage_tokenizer,
                                         data.test, device, corpus=corpus)

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """A SparseEncoder folder's SPLADE encoder for both sides, with its tokenizer; the request's prompts where
        given, else the folder's own."""
        if request.pooling is not None:
            raise UsageError(f"--pooling {request.pooling} applies to a dense model folder; MODEL {request.name} is a "
                             "SparseEncoder folder, which pools as SPLADE (drop --pooling)")
        request.check_max_length(folder)
        quiet_transformers()
        try:
            layout = read_sentence_transformer_folder(folder)
            encoder = SpladeEncoder(folder)
            tokenizer = HuggingFaceTokenizer(folder, request.max_length or layout.max_seq_length
                                             or RunConfig.max_length)
        except ImportError as error:
            raise UsageError(str(error)) from error
        except (ValueError, OSError) as error:
            raise UsageError(f"MODEL {request.name}: {error}") from error
        query_prompt, passage_prompt = request.prompts_or(layout.query_prompt, layout.passage_prompt)
        model = BiEncoder(encoder).to(request.device).eval()
        return LoadedModel(self, f"SparseEncoder folder {folder}", model, request.device, tokenizer=tokenizer,
                           encode_query=model.encode_query, encode_passage=model.encode_passage,
                           query_prompt=query_prompt, passage_prompt=passage_prompt)

    # --- export -----------------------------------------------------------------------------------------
    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A sentence-transformers SparseEncoder folder (gradcache/train/export/sparse_encoder.py)."""
        write_sparse_encoder_folder(model.query_tower, text_model_folder(config.model), config.max_length, folder,
                                    query_prompt=config.query_prompt, passage_prompt=config.passage_prompt)

    def summary(self, loss: nn.Module) -> dict[str, Any]:
        """The loss's three parts at the last step (weighted; under --strategy naive, its last micro-batch's):
        `final_base_loss`, `final_document_regularizer_loss`, `final_query_regularizer_loss`."""
        return {f"final_{name}": float(value) for name, value in loss.parts.items()}


def _transformer_folder(config: RunConfig) -> Path:
    """Where `--model` keeps its config.json: the folder, or a sentence-transformers folder's Transformer path."""
    folder = text_model_folder(config.model)
    try:
        layout = read_sentence_transformer_folder(folder)
    except ValueError as error:
        raise UsageError(f"--model {config.model}: {error}") from error
    return folder if layout is None else layout.model_path
