"""A trained model in use (`gradcache encode`, `eval`, `mine`): `LoadedModel`, what it embeds and with which kind of
model, and `ModelRequest`, what the command line asked of it (device, length, pooling, prompts).

Each mode and kind builds its own `LoadedModel`: from a run of its own (`Mode.loaded_from_run`) and from a model
folder of its own format (`Mode.load_folder`); gradcache/train/commands/model.py only finds which one reads MODEL.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from gradcache.models.query_expansion import QueryExpansion
from gradcache.train.errors import UsageError
from gradcache.train.eval.representations import Representation

if TYPE_CHECKING:
    from gradcache.train.checkpoints.meta import CheckpointMeta
    from gradcache.train.config import RunConfig


class ModelKind(Protocol):
    """What the commands ask of the mode or kind a model is (gradcache/train/modes/base.py `Mode`, which answers)."""

    kind: str | None  # its `--kind`, in a mode of several kinds (text)
    text_embeddings: Representation  # how its texts are embedded, written by encode and ranked by eval
    ranks_passages: bool  # queries rank passages: eval --data pairs, --corpus
    mines: bool  # gradcache mine ranks by its embeddings

    @property
    def model_noun(self) -> str: ...


@dataclass(frozen=True)
class ModelRequest:
    """What `gradcache encode / eval / mine` ask of MODEL, beside its name.

    Args:
        name: the MODEL argument, for messages.
        device: where the model runs.
        max_length: `--max-length`, most tokens per text; None: the run's, else the folder's, else 128.
        pooling: `--pooling`, a dense model folder's pooling; None: the folder's own.
        query_prompt, passage_prompt: a text model folder's prompts; None: the folder's own, else none.
    """

    name: str
    device: torch.device
    max_length: int | None = None
    pooling: str | None = None
    query_prompt: str | None = None
    passage_prompt: str | None = None

    @property
    def prompts(self) -> tuple[str | None, str | None]:
        return self.query_prompt, self.passage_prompt

    def prompts_or(self, query_prompt: str | None, passage_prompt: str | None) -> tuple[str | None, str | None]:
        """The prompts given, each side falling back to the folder's own (`query_prompt`, `passage_prompt`)."""
        return (self.query_prompt if self.query_prompt is not None else query_prompt,
                self.passage_prompt if self.passage_prompt is not None else passage_prompt)

    def check_max_length(self, folder: Path) -> None:
        """`--max-length` at most the positions of the model of `folder` (the config.json of its transformer,
        models/model_positions.py), else UsageError naming it, the bound and the fix, before anything is tokenised
        to it; None (the folder's own length) passes."""
        from gradcache.models.hf_tokenizer import tokenizer_folder
        from gradcache.models.model_positions import check_tokens

        if self.max_length is None:
            return
        try:
            check_tokens(self.max_length, "--max-length", tokenizer_folder(folder)[0])
        except ValueError as error:
            raise UsageError(f"MODEL {self.name}: {error}") from error


@dataclass
class LoadedModel:
    """A model ready to embed, whatever MODEL named.

    Args:
        mode: the mode or kind of model it is (a `Mode` of gradcache/train/modes/): what the commands ask of it
            (`model_noun`, `text_embeddings`, `ranks_passages`, `mines`).
        source: what was loaded, for messages ("run runs/x (last.pt, step 24)").
        module: the whole model, in eval mode on its device.
        device: where it runs.
        tokenizer: texts -> token tensors (text, clip); None for an image-only model.
        encode_query: tokens -> (B, D), the query side (text: the query tower; clip: the text tower).
        encode_passage: tokens -> (B, D), the corpus side (text: the passage tower; clip: the text tower).
        encode_image: (B, 3, H, W) in [-1, 1] -> (B, D) (clip, simclr).
        image_size: the side images are decoded to (clip, simclr).
        config: the run's options, and meta its checkpoint's meta, for a run; None for a model folder.
        query_prompt, passage_prompt: text models: the texts prepended to queries and to passages (a run's
            `--query-prompt` / `--passage-prompt`, a folder's prompts "query" / "document"); None: none.
        query_expansion: multi-vector models: how queries are expanded (a run's `--query-expansion`, a folder's
            `query_expansion`); None: not at all.
        score_pairs: a model that scores (query, passage) pairs instead of embedding them (a cross-encoder): pairs
            -> (B,) logits; `activation` is what predict applies to them.
        embed_inputs: a vision-language model: (inputs, tower) -> (B, D), each input a text, its images or both
            (`gradcache.models.VisionLanguageInput`, images opened), embedded as the `tower` side ("query" or
            "passage") with that side's prompt and the model's pixel budget.
    """

    mode: ModelKind
    source: str
    module: nn.Module
    device: torch.device
    tokenizer: Callable[[list[str]], dict[str, torch.Tensor]] | None = None
    encode_query: Callable[..., torch.Tensor] | None = None
    encode_passage: Callable[..., torch.Tensor] | None = None
    encode_image: Callable[[torch.Tensor], torch.Tensor] | None = None
    image_size: int | None = None
    config: RunConfig | None = None
    meta: CheckpointMeta | None = None
    query_prompt: str | None = None
    passage_prompt: str | None = None
    query_expansion: QueryExpansion | None = None
    score_pairs: Callable[[list[tuple[str, str]]], torch.Tensor] | None = None
    activation: Callable[[torch.Tensor], torch.Tensor] = torch.sigmoid
    embed_inputs: Callable[[Sequence[Any], str], torch.Tensor] | None = None

    def side_tokenizer(self, tower: str) -> Callable[[list[str]], dict[str, torch.Tensor]]:
        """texts -> tokens of the `tower` side ("query" or "passage"): after that side's prompt, if any; queries
        expanded as `query_expansion` says."""
        prompt = self.query_prompt if tower == "query" else self.passage_prompt
        expansion = self.query_expansion if tower == "query" else None
        if expansion is not None:
            return self.tokenizer.with_prompt(prompt, expansion)
        return self.tokenizer if prompt is None else self.tokenizer.with_prompt(prompt)

    def side_encoder(self, tower: str) -> Callable[..., torch.Tensor]:
        """tokens -> embeddings of the `tower` side ("query" or "passage")."""
        return self.encode_query if tower == "query" else self.encode_passage

    @property
    def embeds_text(self) -> bool:
        return self.tokenizer is not None

    @property
    def embeds_images(self) -> bool:
        return self.encode_image is not None

    @property
    def embeds_inputs(self) -> bool:
        """A vision-language model: each input a text, its images or both, embedded as one (`embed_inputs`)."""
        return self.embed_inputs is not None

    @property
    def noun(self) -> str:
        """What messages call it ("a text model", "a clip model"): its mode's `model_noun`."""
        return self.mode.model_noun
