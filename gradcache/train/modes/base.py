"""What a training mode is: everything that differs between SimCLR, CLIP, text and the modes to come.

The loop, the checkpoints and the command line know a mode only through this interface: its model, loss and
encoders; its data (any `Splits`) and batches; its evaluation and baselines; what runs after each optimizer
step; and its options and their defaults. The modes that train an image encoder share `ImageMode`
(modes/image.py: the image options, the image presets, the built-in image data). A new mode is one subclass
in this folder, registered in `MODES` (gradcache/train/modes/__init__.py); nothing elsewhere asks what kind
of mode it is. Each kind of text model (`--kind`) is a subclass of `Text` (modes/text.py) registered in `TEXT_KINDS`,
and answers the same questions, down to how `gradcache encode`, `eval` and `mine` use it (`LoadedModel`,
modes/loaded_model.py) and what its model card says.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import losses
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.splits import Splits
from gradcache.train.eval.representations import VECTORS, Representation
from gradcache.train.model_folders import ModelFolderFormat

if TYPE_CHECKING:
    from gradcache.train.checkpoints.meta import CheckpointMeta
    from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest


class OptionGroups(NamedTuple):
    """The groups of `gradcache train <mode> --help` that a mode adds its own options to."""

    data: argparse._ArgumentGroup
    model: argparse._ArgumentGroup
    run: argparse._ArgumentGroup
    output: argparse._ArgumentGroup


class Mode:
    """One kind of contrastive training; subclasses fill in the class attributes and the methods that raise."""

    name: str
    help: str  # one line for `gradcache train --help`
    negatives_loss: str | nn.Module  # the loss's name (or an instance) for gradcache.negatives_per_anchor
    path_data: str  # what a --data path holds, for help and errors
    worker_work = "reading and preparing batches"  # what a data loader worker does, for --workers' help
    defaults: dict[str, Any] = {}  # RunConfig fields whose default differs in this mode
    default_epochs: int = 1  # when neither --epochs nor --steps is given
    trim_padding: bool = False  # the strategies may trim padding columns (exact only for masked encoders)
    sparse_cache: bool = False  # GradCache caches (B, V) rows by their non-zeros (gradcache/sparse_rows.py)
    items: str  # what the data is made of, for help and messages ("images", "rows")
    built_in_help: str  # the built-in data sets `--data` names, for its help
    kind: str | None = None  # the `--kind` of model it is, in a mode of several (text); None: the mode is one kind
    kind_fields: tuple[str, ...] = ()  # text's `--kind`s: the RunConfig fields only that kind reads
    kind_defaults: dict[str, Any] = {}  # text's `--kind`s: defaults of a new run's options not given (the peer's)
    temperature_help = ""  # what --temperature's help adds in this mode
    deepspeed_refusal: str | None = None  # why --deepspeed cannot train this mode, or None
    # in use (`gradcache encode`, `eval`, `mine`; modes/loaded_model.py)
    text_embeddings: Representation = VECTORS  # how its texts are embedded, written by encode and ranked by eval
    ranks_passages = False  # queries rank passages: `eval --data` pairs, `--corpus`
    mines = False  # `gradcache mine` ranks by its embeddings
    folder_formats: tuple[ModelFolderFormat, ...] = ()  # the model folders of its own format it loads

    # --- options ----------------------------------------------------------------------------------------
    def add_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        """This mode's own options, each into its group; `default(field)` is the field's default here."""

    def check_model(self, config: RunConfig) -> None:
        """Refuse a `--model` this mode cannot build (UsageError), cheaply: before anything is written."""
        raise NotImplementedError

    def random_heads(self, config: RunConfig) -> list[str]:
        """What a new run's model would start from random initialisation because `--model`'s weights lack it,
        one sentence each naming the folder, the missing weights and the fix (preflight warns of each, at start);
        none by default. Cheap: read from the folder's configuration and weight names, no weight loaded."""
        return []

    def check(self, config: RunConfig) -> None:
        """Refuse combinations of options that only this mode cannot run (UsageError). A field's range is its
        `option(...)` metadata's and an option the library checks is refused by the library's check, both in
        gradcache/train/preflight.py, so neither is checked here."""

    # --- data -------------------------------------------------------------------------------------------
    def load_data(self, config: RunConfig) -> Splits:
        """The run's training and held-out data, from `--data` (UsageError or DataError if it cannot be used)."""
        raise NotImplementedError

    def save_data_index(self, config: RunConfig, data: Splits) -> None:
        """Write into the run folder what loading the data computed that a resume reuses (text: the row index),
        on rank 0 once every check has passed. DataDiskFull when the disk is full (no partial file left)."""

    def batches(self, config: RunConfig, data: Splits, sampler: StepSampler) -> DataLoader:
        """One batch of strategy inputs per step, in the order `sampler` gives."""
        raise NotImplementedError

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> nn.Module:
        raise NotImplementedError

    def build_loss(self, config: RunConfig) -> nn.Module:
        raise NotImplementedError

    def embedding_width(self, config: RunConfig) -> int:
        """The width of the embeddings the loss sees (`--matryoshka-dims` may not exceed it), read cheaply: from
        the options or a model folder's configuration, before anything is built."""
        raise NotImplementedError

    def matryoshka(self, loss: nn.Module, dims: list[int]) -> nn.Module:
        """`loss` (from `build_loss`) summed over the column prefixes `dims` of every embedding it reads
        (`--matryoshka-dims`); `gradcache.train.matryoshka_dims.unwrapped` reaches the mode's own loss inside."""
        return losses.Matryoshka(loss, dims)

    def build_guide(self, config: RunConfig) -> nn.Module | None:
        """A frozen model whose embeddings the loss reads beside the trained ones (text's `--guide`), or None.
        Built at every start (a resume too), kept in eval mode, never trained, never saved in a checkpoint."""
        return None

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module | list[nn.Module]:
        """What the strategy encodes with: one module shared by every input, or one module per input; with the
        `build_guide` model, the guide's inputs too (a frozen tower: encoded once, without a graph)."""
        raise NotImplementedError

    def reused_modules(self, config: RunConfig, model: nn.Module) -> list[nn.Module]:
        """Submodules of `model` that learn nothing and whose outputs the strategy keeps from phase (1) instead of
        running them again (the library's `reuse_outputs`: a frozen vision tower); none by default."""
        return []

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """Runs once on a new run's freshly built model and loss (not on a resume), e.g. to load pretrained
        weights."""

    def chunk_sizes(self, config: RunConfig) -> int | tuple[int, ...]:
        """The strategy's chunk size: one for every input, or one per input."""
        return config.chunk_size

    def hard_negatives(self, config: RunConfig) -> int:
        """Hard negatives per anchor beside the in-batch ones (for the negatives count of the log)."""
        return 0

    def resolve(self, config: RunConfig, data: Splits) -> RunConfig:
        """The configuration with what the data decides filled in (stored in the checkpoint, read by resume)."""
        return config

    def after_step(self, config: RunConfig, loss: nn.Module) -> None:
        """Runs after every optimizer step."""

    # --- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, config: RunConfig, model: nn.Module, data: Splits,
                 device: torch.device) -> dict[str, float]:
        """The held-out metrics (percentages) of `model` as it is now, in eval mode, without gradients and
        without touching the global random state, so evaluating during a run does not change the run."""
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
                return self.metrics(config, model, data, device)
        finally:
            model.train(was_training)

    def metrics(self, config: RunConfig, model: nn.Module, data: Splits,
                device: torch.device) -> dict[str, float]:
        raise NotImplementedError

    def baselines(self, config: RunConfig, data: Splits, initial: dict[str, float]) -> dict[str, float]:
        """Scores that show what training bought, given the metrics of the model at step 0."""
        return {}

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    @property
    def model_noun(self) -> str:
        """What messages call a model of it ("a clip model")."""
        return self.name

    def loaded_from_run(self, request: ModelRequest, run: Path, config: RunConfig, model: nn.Module,
                        meta: CheckpointMeta, source: str) -> LoadedModel:
        """A run's `model` (eval mode, on the device), rebuilt from `config`, ready for the commands; UsageError for
        what `request` asks that the run cannot honour."""
        raise NotImplementedError

    def reads_folder(self, found: ModelFolderFormat | None, folder: Path) -> bool:
        """Whether this mode loads the model folder `folder` of format `found` (None: of no format
        gradcache/train/model_folders.py knows, which a new kind's own folder may be, told by its files)."""
        return found in self.folder_formats

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat | None) -> LoadedModel:
        """The model of `folder` (one it `reads_folder`), in eval mode on the request's device; UsageError for a
        folder that does not load or what `request` asks that it cannot honour."""
        raise NotImplementedError

    # --- export -----------------------------------------------------------------------------------------
    def card_command(self, config: RunConfig) -> str:
        """The command the model card says trained it."""
        return f"gradcache train {config.mode}"

    def card_settings(self) -> tuple[str, ...]:
        """The RunConfig fields the model card shows beside the common ones (gradcache/train/export/model_card.py),
        and those it leaves out (`card_hidden`)."""
        return self.kind_fields

    card_hidden: tuple[str, ...] = ()  # common settings that mean nothing in this mode

    def card_usage(self, config: RunConfig, where: str) -> str:
        """What the model card adds after the export's loading lines, for the folder at `where`: how to prepare
        images and switch to evaluation mode (export/model_card.py's `usage_section`), or nothing."""
        return ""

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """Write the trained `model` (and what users need of `loss`: its temperature) into the empty `folder` in
        the format this mode's users load (gradcache/train/export/), with a README.md of the loading lines."""
        raise NotImplementedError

    def summary(self, loss: nn.Module) -> dict[str, Any]:
        """What metrics.json adds for this mode."""
        return {}
