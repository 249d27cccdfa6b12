"""A toy kind of text model, written as a new kind is written: this one module, and one line in `TEXT_KINDS`
(test_toy_kind.py's fixture), nothing else of the program touched.

`--kind bag`: a text is the masked mean of its tokens' embeddings (a fresh table of the `--model` tokenizer's
vocabulary, `--model`'s hidden size wide; no transformer), trained by the dense kind's InfoNCE, scored as it is.
Its export is a format of its own: `bag.safetensors` (the table), `bag.json` and the tokenizer in `tokenizer/`,
which no other kind reads and which this kind loads back for `gradcache encode` and `eval`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from gradcache.models import BiEncoder, HuggingFaceTokenizer
from gradcache.models.huggingface_folder import hidden_size
from gradcache.train.config import RunConfig
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.text import Text
from gradcache.train.modes.text_folders import text_model_folder

WEIGHTS, SETTINGS, TOKENIZER = "bag.safetensors", "bag.json", "tokenizer"


class BagOfEmbeddings(nn.Module):
    """(B, L) token ids with their mask -> (B, D) the mean of the unmasked tokens' embeddings."""

    def __init__(self, vocab_size: int, width: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(self.embedding.weight.dtype)  # (B, L, 1)
        return (self.embedding(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, D)


class Bag(Text):
    kind = "bag"
    kind_help = "a test's toy: the mean of the tokens' embeddings, no transformer"
    refused = {"separate_towers": "one table embeds both sides", "lora_rank": "there is no transformer to adapt",
               "pooling": "the bag is its own mean pooling"}
    folder_description = "bag folder"
    trained_only_by_its_kind = True
    folder_formats = ()  # its folders are of no format model_folders.py knows: `reads_folder` tells them

    def build_model(self, config: RunConfig) -> nn.Module:
        folder = text_model_folder(config.model)
        vocab_size = len(HuggingFaceTokenizer(folder, config.max_length).tokenizer)
        return BiEncoder(BagOfEmbeddings(vocab_size, hidden_size(folder)))

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """Nothing to say: no adapter."""

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        table = model.query_tower.embedding.weight.detach().cpu().contiguous()
        save_file({"embedding.weight": table}, folder / WEIGHTS)
        (folder / SETTINGS).write_text(json.dumps({"vocab_size": table.shape[0], "width": table.shape[1],
                                                   "max_length": config.max_length}), encoding="utf-8")
        shutil.copytree(text_model_folder(config.model), folder / TOKENIZER,
                        ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        (folder / "README.md").write_text("# A bag of embeddings\n\nRUN/model/bag.safetensors\n", encoding="utf-8")

    def reads_folder(self, found: ModelFolderFormat | None, folder: Path) -> bool:
        return (folder / SETTINGS).is_file() and (folder / WEIGHTS).is_file()

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat | None) -> LoadedModel:
        from safetensors.torch import load_file

        settings = json.loads((folder / SETTINGS).read_text(encoding="utf-8"))
        bag = BagOfEmbeddings(settings["vocab_size"], settings["width"])
        bag.load_state_dict(load_file(folder / WEIGHTS))
        model = BiEncoder(bag).to(request.device).eval()
        tokenizer = HuggingFaceTokenizer(folder / TOKENIZER, request.max_length or settings["max_length"])
        return LoadedModel(self, f"bag folder {folder}", model, request.device, tokenizer=tokenizer,
                           encode_query=model.encode_query, encode_passage=model.encode_passage)
