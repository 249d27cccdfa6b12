"""GradCacheCrossEncoderLoss: GradCache as the cross-encoder `CachedMultipleNegativesRankingLoss` of
sentence-transformers, for `CrossEncoderTrainer`: the same in-batch negatives, the same loss, the pairs tokenised
chunk by chunk."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gradcache.cache import GradCache
from gradcache.integrations.sentence_transformers.encoders import refuse_patched_forward
from gradcache.integrations.sentence_transformers.progress import ChunkProgress
from gradcache.integrations.sentence_transformers.spellings import PeerSpellings, count_of, temperature_of
from gradcache.integrations.wrappers import check_wrapper
from gradcache.losses import ListwiseRerank
from gradcache.options import Options, Unpack
from gradcache.ranges import check_int

SCALE, CHUNK_SIZE = 10.0, 32  # the peer's defaults: scale (= 1 / temperature) and mini_batch_size
PASSED_ON = ("memory_budget", "autocast_dtype", "check_recompute", "fsdp_reduce")  # GradCache options that apply


@dataclass(frozen=True)
class _Pairs:
    """(query, candidate) pairs with the prompt and task they are tokenised with: one input, or one chunk."""

    pairs: Sequence[tuple[str, str]]
    prompt: str | None
    task: str | None

    def __len__(self) -> int:
        return len(self.pairs)


def _split(value: _Pairs, chunk_size: int) -> list[_Pairs]:
    """The peer's mini-batches: consecutive slices of `chunk_size` pairs."""
    return [_Pairs(value.pairs[start : start + chunk_size], value.prompt, value.task)
            for start in range(0, len(value), chunk_size)]


class _PairScores(nn.Module):
    """A CrossEncoder (or the trainer's wrapper of it) as a GradCache encoder: a chunk of pairs, tokenised by the
    model's own `preprocess` with the chunk's prompt and task, to its (B,) scores, as the peer's mini-batch."""

    def __init__(self, model: nn.Module, on_forward: Callable[[], None]) -> None:
        super().__init__()
        self.model = model
        self.on_forward = on_forward
        if callable(getattr(model, "no_sync", None)):
            self.no_sync = model.no_sync

    def forward(self, chunk: _Pairs) -> torch.Tensor:
        from sentence_transformers.util import batch_to_device

        cross_encoder = getattr(self.model, "module", self.model)  # a DDP wrapper holds it as .module
        features = cross_encoder.preprocess(list(chunk.pairs), prompt=chunk.prompt, task=chunk.task)
        features = batch_to_device(features, cross_encoder.device)
        scores = self.model(features)["scores"].squeeze(1)  # (B, 1) -> (B,)
        self.on_forward()
        return scores


def in_batch_negatives(anchors: Sequence[str], candidates: Sequence[Sequence[str]],
                       num_negatives: int | None) -> list[list[str]]:
    """The peer's in-batch negatives (its `get_in_batch_negatives`), drawn by the same call: for each anchor,
    `num_negatives` of the other anchors' candidates by `torch.multinomial` over the mask of the N x N C
    candidates that are not its own (C columns: positive and hard negatives), or all of them when
    `num_negatives` is None or not below their count. Returns one column of N candidates per negative drawn."""
    batch_size, columns = len(anchors), len(candidates)
    flattened = [candidate for column in candidates for candidate in column]
    mask = ~torch.eye(batch_size, dtype=torch.bool).repeat(1, columns)  # (N, N C): False at an anchor's own
    if num_negatives is not None and num_negatives < len(flattened) - columns:
        indices = torch.multinomial(mask.float(), num_negatives)  # (N, num_negatives), without replacement
    else:
        indices = torch.arange(batch_size * columns).repeat(batch_size, 1)[mask].reshape(batch_size, -1)
    return [[flattened[k] for k in row] for row in indices.T.tolist()]


class GradCacheCrossEncoderLoss(PeerSpellings, nn.Module):
    """The cross-encoder `CachedMultipleNegativesRankingLoss` of sentence-transformers, by GradCache:

    L = -1/N sum_i log( exp(a(s(q_i, p_i)) / t) / sum_{c in group_i} exp(a(s(q_i, c)) / t) ),

    group_i: query i's positive, `num_negatives` other rows' candidates drawn in the batch and its hard
    negatives; a the activation (Sigmoid), t = 1 / scale. Equal to the peer's uncached
    `MultipleNegativesRankingLoss` in value and gradient, and a seeded step equals the peer's cached step,
    dropout included: the in-batch negatives are drawn by the same `torch.multinomial` call over the same mask,
    the step's first random draw, and the N (1 + k) pairs are laid out, cut into chunks and tokenised per chunk
    (the model's `preprocess`, with the trainer's prompt and task) as the peer cuts its mini-batches.
    `gradcache.losses.ListwiseRerank` computes the loss over all the cached scores, so a chunk that cuts a
    query's group is exact.

    Both spellings are accepted, in any combination: `temperature` or `scale` (= 1 / temperature), `chunk_size`
    or `mini_batch_size`; two that disagree are refused, naming both.

    Args:
        model: the `CrossEncoder` being trained, with one output label.
        num_negatives: in-batch negatives drawn per query (default 4, the peer's); None for all of them.
        scale: 1 / temperature (default 10, the peer's).
        activation_fn: applied to the scores before the scale (default Sigmoid, the peer's); None for none.
        mini_batch_size: pairs per chunk (default 32, the peer's); memory is that of one chunk.
        show_progress_bar: tqdm bars over the chunks of phase (1) and of phase (3).
        temperature: t > 0, this library's spelling of 1 / scale.
        chunk_size: this library's spelling of `mini_batch_size`.
        **options: `memory_budget`, `autocast_dtype`, `check_recompute`, `fsdp_reduce` of `gradcache.GradCache`.

    Raises:
        ValueError: a model that is not a CrossEncoder with one label, scale or temperature <= 0, two spellings
            that disagree, a chunk size below 1, num_negatives below 1; at the call, fewer than two columns or
            columns of different lengths.
        TypeError: a chunk size that is not an int; another option, or one that does not apply here (`scaler`,
            `gather`, `split_fn`, ...); at the call, a model wrapper GradCache cannot run in.

    Example:
        >>> loss = GradCacheCrossEncoderLoss(model, num_negatives=4, chunk_size=32)
        >>> CrossEncoderTrainer(model=model, train_dataset=pairs, loss=loss).train()
    """

    uses_gradient_cache = True  # sentence-transformers' mark of a loss whose backward re-encodes

    def __init__(
        self, model: nn.Module, num_negatives: int | None = 4, scale: float | None = None,
        activation_fn: nn.Module | None = nn.Sigmoid(), mini_batch_size: int | None = None,
        show_progress_bar: bool = False, *, temperature: float | None = None, chunk_size: int | None = None,
        **options: Unpack[Options],
    ) -> None:
        super().__init__()
        from sentence_transformers.cross_encoder import CrossEncoder

        if not isinstance(model, CrossEncoder):
            raise ValueError(f"{type(self).__name__} expects a CrossEncoder, got {type(model).__name__}.")
        if model.num_labels != 1:
            raise ValueError(
                f"{type(self).__name__} expects a CrossEncoder with 1 output label, got {model.num_labels}; "
                "build it with num_labels=1."
            )
        check_int(num_negatives, "num_negatives", optional="all")
        owner = type(self).__name__
        temperature = temperature_of(owner, temperature, scale, 1.0 / SCALE)
        chunk_size = count_of(owner, "chunk_size", chunk_size, "mini_batch_size", mini_batch_size, CHUNK_SIZE)
        if not isinstance(show_progress_bar, bool):
            raise TypeError(f"show_progress_bar must be True or False, got {show_progress_bar!r}.")
        refused = sorted(set(options) - set(PASSED_ON))
        if refused:
            raise TypeError(
                f"{type(self).__name__} got option(s) {refused}; it takes {list(PASSED_ON)} of GradCache's options "
                "(it splits and tokenises the pairs itself, the trainer owns the backward, and the loss stays on "
                "each device's batch, as the peer's)."
            )
        self.chunk_size = chunk_size
        self.model = model  # a child named "model": the trainer's override_model_in_loss swaps it for its wrapper
        self.num_negatives = num_negatives
        self.activation_fn = activation_fn
        self.loss = ListwiseRerank(temperature, activation=activation_fn)  # checks temperature
        self.show_progress_bar = show_progress_bar
        self.options = {"split_fn": _split, "gather": False, **options}
        self.progress = ChunkProgress(show_progress_bar)
        self._built: tuple[nn.Module, GradCache] | None = None
        GradCache(nn.Identity(), self.loss, self.chunk_size, **self.options)  # checks every option now

    def _strategy(self) -> GradCache:
        """The GradCache around the current `self.model`, built once and rebuilt when the trainer wraps it."""
        if self._built is None or self._built[0] is not self.model:
            self._built = (self.model, GradCache(_PairScores(self.model, self.progress.tick), self._phase_two,
                                                 self.chunk_size, **self.options))
        return self._built[1]

    def forward(self, inputs: list[list[str]], labels: torch.Tensor | None = None, prompt: str | None = None,
                task: str | None = None) -> torch.Tensor:
        """Columns (anchor, positive, hard negative 1, ..., h) of N texts each; `labels` are ignored, as the peer
        ignores them."""
        columns = [list(column) for column in inputs]
        if len(columns) < 2:
            raise ValueError(
                f"{type(self).__name__} got {len(columns)} column(s); it needs (anchor, positive) and optionally "
                "hard negatives: give the dataset at least two text columns besides any label column."
            )
        if len({len(column) for column in columns}) > 1:
            raise ValueError(f"{type(self).__name__} got columns of different lengths {[len(c) for c in columns]}.")
        check_wrapper(self.model, above_the_loss=False, where=type(self).__name__)
        refuse_patched_forward(self.model, type(self).__name__)
        anchors = columns[0]
        candidates = [columns[1], *in_batch_negatives(anchors, columns[1:], self.num_negatives), *columns[2:]]
        pairs = [(anchor, candidate) for column in candidates for anchor, candidate in zip(anchors, column)]
        strategy = self._strategy()
        batch = _Pairs(pairs, prompt, task)  # column after column, the peer's order: (G N,) scores
        with self.progress.call(strategy, [batch], [True]):
            return strategy.loss(batch, group_size=len(candidates))

    def _phase_two(self, scores: torch.Tensor, group_size: int) -> torch.Tensor:
        """(2) The scores, laid out column by column, regrouped by query for ListwiseRerank."""
        grouped = scores.reshape(group_size, -1).T.reshape(-1)  # (G N,) -> (N, G) -> (N G,), positive first
        return self.loss(grouped, group_size=group_size)

    def get_config_dict(self) -> dict[str, Any]:
        """What sentence-transformers writes into the model card (the peer's keys)."""
        from sentence_transformers.util import fullname

        return {"scale": self.scale, "num_negatives": self.num_negatives,
                "activation_fn": fullname(self.activation_fn), "mini_batch_size": self.chunk_size}

    @property
    def citation(self) -> str:
        return (
            "@inproceedings{gao2021scaling, title={Scaling Deep Contrastive Learning Batch Size under Memory "
            "Limited Setup}, author={Gao, Luyu and Zhang, Yunyi and Han, Jiawei and Callan, Jamie}, "
            "booktitle={RepL4NLP}, year={2021}, url={https://arxiv.org/abs/2101.06983}}"
        )
