"""GradCacheLoss: GradCache as a sentence-transformers loss, and the phase (2) that runs through `calculate_loss`,
the hook sentence-transformers' loss modifiers (MatryoshkaLoss) decorate on cached losses."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.cache import GradCache
from gradcache.integrations.sentence_transformers.encoders import (
    SentenceEncoder, refuse_patched_forward, refuse_static_embedding, sentence_embedding,
)
from gradcache.integrations.sentence_transformers.progress import ChunkProgress
from gradcache.integrations.wrappers import check_wrapper
from gradcache.losses import InfoNCE
from gradcache.options import Options, Unpack


def through_calculate_loss(
    calculate_loss: Callable[..., torch.Tensor], embeddings: Sequence[torch.Tensor], *args: Any, owner: str,
) -> torch.Tensor:
    """Phase (2) through sentence-transformers' cached-loss contract: `calculate_loss(reps, *args, with_backward)`
    with `reps` one list of (N, D) leaves per column; with `with_backward=True` it back-propagates into the
    leaves' `.grad` (a MatryoshkaLoss decorator in between truncates, weights and sums per dimension).

    Returns `value + sum_c <e_c - stop_grad(e_c), g_c>`: the loss's value, whose gradient with respect to each
    column's embedding e_c is g_c, the leaf's `.grad`, so that GradCache's phase (3) receives it times whatever
    reaches the loss in the trainer's backward (a 1 / accumulation count, a loss scale). A value that still
    holds a graph (to learnable loss parameters) passes them their gradient the same way.

    Raises:
        ValueError: a column whose embedding the loss never used (no gradient reached it), as
            sentence-transformers' cached losses raise: every column is encoded twice for nothing. Raised in
            phase (2), before any `.grad` is written; `owner` names the loss in the message.
    """
    if not torch.is_grad_enabled():  # evaluation: the value and nothing else
        return calculate_loss([[e] for e in embeddings], *args)
    leaves = [e.detach().requires_grad_() for e in embeddings]
    value = calculate_loss([[leaf] for leaf in leaves], *args, with_backward=True)
    unused = [str(c) for c, leaf in enumerate(leaves) if leaf.grad is None]
    if unused:
        raise ValueError(
            f"the loss of {owner} did not use input column(s) {', '.join(unused)} (counting from 0) of the "
            f"{len(leaves)} it got: their embeddings received no gradient. Every column is encoded twice, once "
            "without and once with a graph, so remove the unused column(s) from the dataset (or use a loss that "
            "reads them). No gradient was written."
        )
    bridge = sum((e * leaf.grad).sum() for e, leaf in zip(embeddings, leaves))
    return value + bridge - bridge.detach()


def backward_into(value: torch.Tensor, reps: Sequence[Sequence[torch.Tensor]], loss: nn.Module, with_backward: bool) -> torch.Tensor:
    """`calculate_loss`'s ending: with `with_backward`, accumulate d value / d rep into every rep's `.grad` and
    return the value detached, or, when `loss` has learnable parameters, still holding its graph to them, so
    that their gradient flows in the trainer's backward with every factor on the way (a Matryoshka weight)."""
    if not with_backward:
        return value
    leaves = [r for column in reps for r in column]
    parameters = [p for p in loss.parameters() if p.requires_grad]
    grads = torch.autograd.grad(value, leaves, retain_graph=bool(parameters), allow_unused=True)
    for leaf, grad in zip(leaves, grads):
        if grad is not None:
            leaf.grad = grad if leaf.grad is None else leaf.grad + grad
    return value if parameters else value.detach()


def _columns_to_loss(loss: nn.Module, anchor: torch.Tensor, positive: torch.Tensor, *negatives: torch.Tensor):
    """Columns (anchor, positive, negative 1, ..., negative h), each (N, D), as `loss(anchor, positive)` or
    `loss(anchor, positive, negatives)` with negatives (N * h, D) grouped by query, InfoNCE's signature."""
    if not negatives:
        return loss(anchor, positive)
    grouped = torch.stack(negatives, dim=1).reshape(-1, anchor.shape[-1])  # (N, h, D) -> (N * h, D)
    return loss(anchor, positive, grouped)


class GradCacheLoss(nn.Module):
    """The loss over the whole batch at the memory of one chunk: `loss(model(col) for col in columns)`,
    computed by GradCache (the trainer's `backward()` runs the second, chunked pass).

    With `InfoNCE(temperature=t)` it equals sentence-transformers' `MultipleNegativesRankingLoss(model,
    scale=1 / t)` (cosine similarity; every anchor against every positive and hard negative in the batch),
    value and gradient, and its defaults are `CachedMultipleNegativesRankingLoss`'s: each chunk's trailing
    padding is trimmed (`trim_padding=True` here, where the library's own default is False), so a step with
    dropout on draws the same masks and equals CMNRL's step at `mini_batch_size=chunk_size`; no progress bar;
    no gather across devices. The batch arrives as the trainer's columns (anchor, positive, hard negative 1,
    ..., h), each split into chunks of `chunk_size` rows. Labels are ignored, as MNRL ignores them.

    Works inside `MatryoshkaLoss(model, GradCacheLoss(...), dims)`: it marks itself `uses_gradient_cache`
    and computes phase (2) through `calculate_loss`, which MatryoshkaLoss decorates to truncate the cached
    embeddings, so it equals `MatryoshkaLoss(model, MultipleNegativesRankingLoss(...), dims)`, with
    `n_dims_per_step` too. `AdaptiveLayerLoss` around it is refused (TypeError at its first call): it patches
    the model's forward for the first pass only.

    The GradCache strategy is built once and kept (its step count runs on), and rebuilt only when `self.model`
    changes: the trainer replaces it by its DDP or compiled wrapper on its first `compute_loss`; the wrapper's
    gradients are synchronised once per step.

    Args:
        model: the SentenceTransformer being trained.
        loss: called as `loss(anchor, positive)` on two columns, or `loss(anchor, positive, negatives)` with
            negatives (N * h, D) grouped by query on more: `gradcache.losses.InfoNCE` (default, temperature
            0.05, i.e. scale 20), or `ClipLoss` / `SigLipLoss` on two columns. Its parameters (a learnable
            temperature) are trained too: the trainer's optimizer reads the loss's parameters.
        chunk_size: rows per chunk of every column (CMNRL's `mini_batch_size`); memory is that of one chunk.
        trim_padding: drop each chunk's trailing all-padding columns (default True, as CMNRL does); exact for
            models that ignore masked positions, as BERT-style encoders with mean or CLS pooling do.
        gather_across_devices: under torch.distributed, the loss over every rank's embeddings (the global
            batch); default False, as MNRL's and CMNRL's.
        show_progress_bar: a tqdm bar over the chunks of phase (1) and one over phase (3); default False.
        **options: every other option of `gradcache.GradCache` (`chunk_tokens`, `memory_budget`,
            `autocast_dtype`, `check_recompute`, `image_token_id`, ...; `gradcache.options.Options`), passed
            through as given (one naming submodules of `model` is checked against it here), but `scaler`, since the
            trainer owns the backward, and `gather`, spelled `gather_across_devices` here; `get_embedding`
            defaults to picking "sentence_embedding" from the model's output.

    Raises:
        TypeError, ValueError: bad options or a model based on a StaticEmbedding (ValueError: its features have
            no batch dimension to chunk), here; at the call, fewer than two columns or a loss that leaves a
            column unused (ValueError, before any `.grad` is written), a model
            wrapper GradCache cannot run in (TypeError: DataParallel, FSDP1, DeepSpeed; see
            `gradcache.integrations.wrappers`) or a forward patched by a loss modifier (TypeError).

    Example:
        >>> loss = GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=32)
        >>> SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss).train()
    """

    uses_gradient_cache = True  # sentence-transformers' mark of a loss whose backward re-encodes (MatryoshkaLoss reads it)
    uncached = "MultipleNegativesRankingLoss"  # sentence-transformers' loss this one equals, named in messages

    def __init__(
        self, model: nn.Module, loss: nn.Module | None = None, chunk_size: int = 32, *, trim_padding: bool = True,
        gather_across_devices: bool = False, show_progress_bar: bool = False, **options: Unpack[Options],
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a SentenceTransformer (an nn.Module), got {type(model).__name__}.")
        refuse_static_embedding(model, type(self).__name__, "model", f"train it with sentence-transformers' "
                                f"{self.uncached}, uncached: a StaticEmbedding model needs little memory per example")
        if options.get("scaler") is not None:
            raise TypeError(
                "GradCacheLoss got a scaler, which it cannot honour: the trainer owns the backward and scales the "
                "loss itself (fp16=True in the training arguments). Drop the scaler argument."
            )
        if "gather" in options:
            raise TypeError(
                f"{type(self).__name__} got gather={options['gather']!r}; it is spelled gather_across_devices here, "
                "as in sentence-transformers' losses."
            )
        if not isinstance(show_progress_bar, bool):
            raise TypeError(f"show_progress_bar must be True or False, got {show_progress_bar!r}.")
        self.model = model  # a child named "model": the trainer's override_model_in_loss swaps it for its wrapper
        self.loss = loss if loss is not None else InfoNCE(temperature=0.05)
        self.chunk_size = chunk_size
        self.show_progress_bar = show_progress_bar
        self.options = {"get_embedding": sentence_embedding, "trim_padding": trim_padding,
                        "gather": gather_across_devices, **options}
        self.progress = ChunkProgress(show_progress_bar)
        self._built: tuple[nn.Module, int, GradCache] | None = None
        # checks chunk_size and every option now, around the model itself, so an option that names its
        # submodules (reuse_outputs: a frozen vision tower) is checked against it
        GradCache(SentenceEncoder(model, self.progress.tick), self._phase_two, chunk_size, **self.options)

    def _strategy(self, columns: int) -> GradCache:
        """The GradCache for `columns` columns around the current `self.model`, built once and kept."""
        if self._built is not None and self._built[0] is self.model and self._built[1] == columns:
            return self._built[2]
        strategy = GradCache(self._encoders(columns), self._phase_two, self.chunk_size, **self.options)
        if self._built is not None:
            strategy.steps_taken = self._built[2].steps_taken  # the same run: its steps count on
        self._built = (self.model, columns, strategy)
        return strategy

    def _encoders(self, columns: int) -> nn.Module | list[nn.Module]:
        return SentenceEncoder(self.model, self.progress.tick)

    def _inputs(self, columns: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return columns

    def check_columns(self, columns: list[Mapping[str, Any]]) -> None:
        if len(columns) < 2:
            raise ValueError(
                f"{type(self).__name__} got {len(columns)} column(s); it needs (anchor, positive) and optionally "
                "hard negatives: give the dataset at least two text columns besides any label column."
            )

    def forward(self, sentence_features: Iterable[Mapping[str, Any]], labels: torch.Tensor | None = None) -> torch.Tensor:
        columns = list(sentence_features)
        self.check_columns(columns)
        check_wrapper(self.model, above_the_loss=False, where=type(self).__name__)
        refuse_patched_forward(self.model, type(self).__name__)
        strategy = self._strategy(len(columns))
        inputs = self._inputs(columns)
        learning = [i < len(columns) for i in range(len(inputs))]  # the model's columns; a guide's are constants
        with self.progress.call(strategy, inputs, learning):
            return strategy.loss(*inputs, labels=labels)

    def _phase_two(self, *embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return through_calculate_loss(self.calculate_loss, embeddings, labels, owner=type(self).__name__)

    def calculate_loss(
        self, reps: list[list[torch.Tensor]], labels: torch.Tensor | None = None, *, with_backward: bool = False
    ) -> torch.Tensor:
        """sentence-transformers' cached-loss hook: the loss over the batch from `reps`, one list of (rows, D)
        embeddings per column; with `with_backward`, their gradients land in each rep's `.grad`."""
        value = _columns_to_loss(self.loss, *(torch.cat(column) for column in reps))
        return backward_into(value, reps, self.loss, with_backward)

    @property
    def steps_taken(self) -> int:
        """Calls with gradients so far (GradCache's count; the step a non-finite loss error names is one more)."""
        return self._built[2].steps_taken if self._built is not None else 0

    def get_config_dict(self) -> dict[str, Any]:
        """What sentence-transformers writes into the model card."""
        options = {k: v for k, v in self.options.items() if k not in ("get_embedding", "gather")}
        return {"loss": repr(self.loss), "chunk_size": self.chunk_size, "gather_across_devices": self.options["gather"],
                "show_progress_bar": self.show_progress_bar, **options}

    @property
    def citation(self) -> str:
        return (
            "@inproceedings{gao2021scaling, title={Scaling Deep Contrastive Learning Batch Size under Memory "
            "Limited Setup}, author={Gao, Luyu and Zhang, Yunyi and Han, Jiawei and Callan, Jamie}, "
            "booktitle={RepL4NLP}, year={2021}, url={https://arxiv.org/abs/2101.06983}}"
        )
