"""`gradcache train text --kind multi-vector`: late interaction (ColBERT). The `--model` encoder's token states
projected to `--token-dim` and L2-normalised per token (gradcache.models.multi_vector), trained by
`LateInteraction` (InfoNCE over MaxSim scores, in-batch and hard negatives, tiled by `--tile-size`), scored by
MaxSim retrieval of the held-out queries (gradcache/train/eval/maxsim.py), exported as a sentence-transformers
`MultiVectorEncoder` folder (gradcache/train/export/multi_vector.py).

Queries and passages are tokenised as the exported `MultiVectorEncoder` tokenises them: the `--model` folder's
tokenizer, at most `--max-length` tokens, `--query-prompt` / `--passage-prompt` prepended (its prompts "query"
and "document"), no skiplist, so every real token is scored. With `--query-expansion LENGTH` (or a `--model`
MultiVectorEncoder folder's own expansion, unless it is given) every query is exactly LENGTH tokens, its padding
replaced by the mask token and scored (ColBERT's query expansion, models/query_expansion.py), attended too with
`--attend-to-expansion`; the export carries it. Passages are never expanded.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradcache import distributed, losses
from gradcache.models.multi_vector import MultiVectorTextEncoder
from gradcache.models.multi_vector_folder import is_multi_vector_folder, read_multi_vector_folder
from gradcache.token_embeddings import TokenEmbeddings
from gradcache.train.config import RunConfig
from gradcache.train.data.text.text_pairs import TextSplits
from gradcache.train.errors import UsageError
from gradcache.train.eval.maxsim import evaluate_maxsim_retrieval
from gradcache.train.eval.representations import TOKEN_VECTORS
from gradcache.train.export.multi_vector import write_multi_vector_folder
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import OptionGroups
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.text import Text
from gradcache.train.modes.text_folders import (
    check_positions,
    check_text_folder,
    query_expansion,
    quiet_transformers,
    side_tokenizers,
    text_model_folder,
)

class MultiVector(Text):
    kind = "multi-vector"
    kind_help = ("one vector per token, scored by MaxSim (ColBERT's late interaction; a sentence-transformers "
                 "MultiVectorEncoder)")
    trim_padding = True  # the attention ignores trimmed padding and the scoring mask drops it
    kind_fields = ("token_dim", "query_expansion", "attend_to_expansion")
    kind_defaults = {"temperature": 1.0}  # MultiVectorMultipleNegativesRankingLoss's scale 1
    refused = {  # the dense kind's options late interaction cannot honour (Text.check)
        "pooling": "every token is kept, none pooled",
        "exclude_prompt_from_pooling": "nothing is pooled",
        "separate_towers": "it trains one shared tower",
        "symmetric": "MaxSim is not symmetric: queries retrieve passages",
        "guide": "the guide's filter is written for dense vectors",
        "queue_size": "LateInteraction keeps no queue",
        "matryoshka_dims": "token vectors are not truncated in training",
        "lora_rank": "the export writes whole weights",
    }
    text_embeddings = TOKEN_VECTORS
    mines = False  # mine ranks by dense embeddings
    folder_formats = (ModelFolderFormat.MULTI_VECTOR,)
    folder_description = ("multi-vector folder (a sentence-transformers MultiVectorEncoder: a projection of every "
                          "token after its transformer)")
    trained_only_by_its_kind = True
    refused_formats = {ModelFolderFormat.SPARSE_ENCODER: "it pools nothing, so --pooling does not apply to it"}

    def add_kind_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        groups.model.add_argument("--token-dim", type=int, default=default("token_dim"),
                                  help="--kind multi-vector: the width of each token vector, the projection of the "
                                  "model's hidden states (default: %(default)s, ColBERT's)")
        groups.model.add_argument("--query-expansion", type=int, default=default("query_expansion"),
                                  metavar="LENGTH",
                                  help="--kind multi-vector: every query exactly LENGTH tokens, the shorter padded "
                                  "with the mask token, which MaxSim scores (ColBERT's query expansion; ColBERT and "
                                  "PyLate use 32) (default: none, or the --model MultiVectorEncoder folder's own)")
        groups.model.add_argument("--attend-to-expansion", action="store_true",
                                  default=default("attend_to_expansion"),
                                  help="--kind multi-vector, with --query-expansion: the encoder attends to the "
                                  "expansion tokens too (PyLate's attend_to_expansion_tokens) (default: scored, "
                                  "not attended)")

    def check(self, config: RunConfig) -> None:
        """The text kinds' checks (Text.check); --attend-to-expansion only with --query-expansion."""
        super().check(config)
        if config.attend_to_expansion and config.query_expansion is None:
            raise UsageError("--attend-to-expansion attends to the tokens --query-expansion adds, but there are "
                             "none; add --query-expansion LENGTH (ColBERT uses 32), or drop --attend-to-expansion")

    def check_model(self, config: RunConfig) -> None:
        """The folder (a MultiVectorEncoder's too) and its tokenizer load offline and belong together; with
        --query-expansion, a length within the model's positions and a tokenizer that can expand. What else
        Text.check_model checks (pooling, LoRA targets, the guide) this kind refuses."""
        self.check_folder_format(config.model)
        check_text_folder("--model", config.model, None, config.max_length)
        check_positions("--query-expansion", config.query_expansion, "--model", config.model)
        if config.query_expansion is not None:
            side_tokenizers(config)

    def resolve(self, config: RunConfig, data: TextSplits) -> RunConfig:
        """Without --query-expansion, a --model MultiVectorEncoder folder's own expansion, said once (stored in the
        checkpoint, so a resume keeps it); then h and the lengths (Text.resolve), the queries' at that expansion."""
        folder = text_model_folder(config.model)
        if config.query_expansion is not None or not is_multi_vector_folder(folder):
            return super().resolve(config, data)
        try:
            expansion = read_multi_vector_folder(folder).query_expansion
        except ValueError as error:
            raise UsageError(f"--model {config.model}: {error}") from error
        if expansion is None:
            return super().resolve(config, data)
        config = dataclasses.replace(config, query_expansion=expansion.length,
                                     attend_to_expansion=expansion.attend)
        side_tokenizers(config)  # UsageError for a tokenizer that cannot expand
        if distributed.rank() == 0:
            print(f"gradcache train: --model {config.model} expands queries to {expansion.describe()}, and so does "
                  f"this run (--query-expansion {expansion.length}"
                  f"{' --attend-to-expansion' if expansion.attend else ''}; give --query-expansion to change it)",
                  file=sys.stderr)
        return super().resolve(config, data)

    def random_heads(self, config: RunConfig) -> list[str]:
        """The token projection, when `--model` is not a multi-vector folder (one holding a trained token-level
        Dense): it starts at random, as a fresh sentence-transformers/PyLate model's does."""
        folder = text_model_folder(config.model)
        if is_multi_vector_folder(folder):
            return []
        return [f"--model {config.model} ({folder}) holds no token projection (a multi-vector folder's token-level "
                f"Dense): --kind multi-vector trains its projection to --token-dim {config.token_dim} from random "
                "initialisation, so the step-0 scores are near chance; expected from a base encoder, and a "
                "multi-vector (ColBERT) folder starts from its own"]

    def embedding_width(self, config: RunConfig) -> int:
        return config.token_dim

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        from gradcache.models import BiEncoder

        folder = text_model_folder(config.model)
        quiet_transformers()
        try:
            tower = MultiVectorTextEncoder(folder, token_dim=config.token_dim)
        except ValueError as error:
            raise UsageError(f"--model {config.model}: {error}") from error
        return BiEncoder(tower)

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """Nothing to say: no adapter."""

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedLateInteraction(self.hard_negatives(config), config.temperature, tile_size=config.tile_size)

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: TextSplits,
                device: torch.device) -> dict[str, float]:
        corpus = None if data.corpus is None else (data.corpus, data.test_positions)
        query_tokenizer, passage_tokenizer = side_tokenizers(config)
        return evaluate_maxsim_retrieval(model.encode_query, model.encode_passage, query_tokenizer, data.test,
                                         device, corpus=corpus, passage_tokenizer=passage_tokenizer)

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    @property
    def model_noun(self) -> str:
        return self.kind

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """A sentence-transformers MultiVectorEncoder folder (a `--kind multi-vector` export): token embeddings,
        with the folder's tokenizer, max_seq_length, prompts and query expansion unless given."""
        from gradcache.models import BiEncoder, HuggingFaceTokenizer

        if request.pooling is not None:
            raise UsageError(f"--pooling {request.pooling}: MODEL {request.name} is a multi-vector model, which pools "
                             "nothing (drop --pooling)")
        request.check_max_length(folder)
        quiet_transformers()
        try:
            layout = read_multi_vector_folder(folder)
            encoder = MultiVectorTextEncoder(folder)
            tokenizer = HuggingFaceTokenizer(layout.model_path, request.max_length or layout.max_seq_length
                                             or RunConfig.max_length)
        except ImportError as error:
            raise UsageError(str(error)) from error
        except (ValueError, OSError) as error:
            raise UsageError(f"MODEL {request.name}: {error}") from error
        query_prompt, passage_prompt = request.prompts_or(layout.query_prompt, layout.passage_prompt)
        model = BiEncoder(encoder).to(request.device).eval()
        return LoadedModel(self, f"multi-vector model folder {folder}", model, request.device, tokenizer=tokenizer,
                           encode_query=model.encode_query, encode_passage=model.encode_passage,
                           query_prompt=query_prompt, passage_prompt=passage_prompt,
                           query_expansion=layout.query_expansion)

    # --- export -----------------------------------------------------------------------------------------
    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A sentence-transformers MultiVectorEncoder folder (gradcache/train/export/multi_vector.py)."""
        write_multi_vector_folder(model.query_tower, text_model_folder(config.model), config.max_length, folder,
                                  query_prompt=config.query_prompt, passage_prompt=config.passage_prompt,
                                  query_expansion=query_expansion(config))


class GroupedLateInteraction(nn.Module):
    """LateInteraction(query, passages grouped by query, positive first): query tokens (n, Lq, D) against every
    positive and hard negative of the batch, passages (n (1 + h), Lp, D) in the order
    [p_1, n_1_1 .. n_1_h, p_2, ..] (gradcache/train/data/text/batches.py), over all ranks when gathered."""

    def __init__(self, negatives_per_query: int, temperature: float, *, tile_size: int | None = None) -> None:
        super().__init__()
        self.negatives_per_query = negatives_per_query
        self.late_interaction = losses.LateInteraction(temperature, tile_size=tile_size)

    @property
    def temperature(self) -> float:
        return self.late_interaction.temperature

    def forward(self, query: TokenEmbeddings, passages: TokenEmbeddings) -> torch.Tensor:
        h = self.negatives_per_query
        n = query.values.shape[0]
        if passages.values.shape[0] != n * (1 + h):
            raise ValueError(f"passages must hold {1 + h} rows per query (positive and {h} hard negatives), got "
                             f"{passages.values.shape[0]} for {n} queries")
        values = passages.values.view(n, 1 + h, *passages.values.shape[1:])  # (n, 1 + h, Lp, D)
        mask = passages.mask.view(n, 1 + h, -1)  # (n, 1 + h, Lp)
        positive = TokenEmbeddings(values[:, 0], mask[:, 0])
        if h == 0:
            return self.late_interaction(query, positive)
        negatives = TokenEmbeddings(values[:, 1:].reshape(n * h, *values.shape[2:]), mask[:, 1:].reshape(n * h, -1))
        return self.late_interaction(query, positive, negatives)
