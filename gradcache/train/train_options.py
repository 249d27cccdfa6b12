"""The options of `gradcache train <mode>`: one option per RunConfig field, defaults from the dataclass
(and the mode's own defaults), choices from where they are defined, and the RunConfig built from it."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from gradcache.distributed import FSDP_REDUCE_MODES
from gradcache.train.config import RunConfig
from gradcache.train.data.held_out import default_held_out_help
from gradcache.train.matryoshka_dims import parse_dims
from gradcache.train.modes import Mode
from gradcache.train.modes.base import OptionGroups
from gradcache.train.optim.optimizers import LR_SCALINGS, OPTIMIZERS
from gradcache.train.run_folder.reporters import REPORT_TO
from gradcache.train.strategy_choice import PRECISIONS, STRATEGIES

_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is: one default per option."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_train_options(parser: argparse.ArgumentParser, mode: Mode) -> None:
    """Every option of `gradcache train <mode>`, group by group, then the mode's own; the help states each default
    once."""
    default: Callable[[str], Any] = lambda name: mode.defaults.get(name, _FIELD_DEFAULTS[name])  # noqa: E731
    data = _data_options(parser, mode, default)
    model = _model_options(parser, mode, default)
    run = _optimisation_options(parser, mode, default)
    _sharding_options(parser, mode, default)
    output = _output_options(parser, mode, default)
    mode.add_options(OptionGroups(data, model, run, output), default)


def _data_options(parser: argparse.ArgumentParser, mode: Mode, default: Callable[[str], Any]) -> argparse._ArgumentGroup:
    """Where the examples come from and how they are read."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", default=default("data"), help=f"{mode.built_in_help} or {mode.path_data}")
    data.add_argument("--train-size", type=int, default=default("train_size"),
                      help=f"built-in data: training {mode.items}")
    data.add_argument("--test-size", type=int, default=default("test_size"),
                      help=f"{mode.items} held out for evaluation ({default_held_out_help(mode.items)})")
    data.add_argument("--data-seed", type=int, default=default("data_seed"),
                      help="seed of the built-in data and the held-out split")
    data.add_argument("--workers", type=int, default=default("workers"), help="data loader worker processes "
                      f"(0: in the main one); {mode.worker_work} in a worker overlaps it with the encoders")
    data.add_argument("--max-bad-share", type=float, default=default("max_bad_share"),
                      help=f"stop before training (exit 4) when more than this share of the {mode.items} cannot be "
                      "used (files that fail to decode, rows without a field); fewer are skipped and counted")
    data.add_argument("--threads", type=int, default=None, help="torch threads of the training process on CPU "
                      "(default: CPU cores minus --workers, at least 1)")
    return data

def _model_options(parser: argparse.ArgumentParser, mode: Mode, default: Callable[[str], Any]) -> argparse._ArgumentGroup:
    """What every mode's model takes (the mode adds its own)."""
    model = parser.add_argument_group("model")
    model.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward")
    return model

def _optimisation_options(parser: argparse.ArgumentParser, mode: Mode, default: Callable[[str], Any]) -> argparse._ArgumentGroup:
    """The strategy, the batch, the loss's shared options and the optimizer."""
    run = parser.add_argument_group("optimisation")
    run.add_argument("--strategy", default=default("strategy"), choices=list(STRATEGIES),
                     help="gradcache: exact full-batch gradient in chunks; naive: accumulation (negatives only "
                          "within a chunk); full: one pass over the whole batch (ignores --chunk-size)")
    run.add_argument("--batch-size", type=int, default=default("batch_size"),
                     help="global contrastive batch over all ranks (negatives follow from it)")
    run.add_argument("--chunk-size", type=int, default=default("chunk_size"),
                     help="examples per encoder pass (larger than the batch: one chunk)")
    run.add_argument("--tile-size", type=int, default=None, help="compute the loss in tiles of this many rows "
                     "(default: dense, no tiles)")
    run.add_argument("--queue-size", type=int, default=default("queue_size"), help="keep this many past "
                     "embeddings of the candidate side as extra negatives (a queue, as MoCo/XBM; advanced once per "
                     "step, or per micro-batch under naive; 0: in-batch negatives only)")
    run.add_argument("--queue-warmup", type=int, default=default("queue_warmup"), help="calls of the loss (steps; "
                     "micro-batches under naive) before the queue is read or filled")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None, help=f"passes over the training data (default: "
                        f"{mode.default_epochs} when --steps is not given)")
    length.add_argument("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    run.add_argument("--optimizer", default=default("optimizer"), choices=list(OPTIMIZERS),
                     help="lars/lamb: for large batches")
    run.add_argument("--lr", type=float, default=default("lr"), help="peak learning rate at --base-batch-size")
    run.add_argument("--lr-scaling", default=default("lr_scaling"), choices=list(LR_SCALINGS),
                     help="scale --lr by (batch / base batch) (linear) or its square root (sqrt)")
    run.add_argument("--base-batch-size", type=int, default=default("base_batch_size"),
                     help="the batch size --lr is stated for")
    run.add_argument("--warmup", type=int, default=default("warmup"),
                     help="linear warm-up steps, then cosine decay to 0 (cut to the run's steps, said on stderr)")
    run.add_argument("--weight-decay", type=float, default=default("weight_decay"),
                     help="on weights, not on biases or norms")
    run.add_argument("--momentum", type=float, default=default("momentum"), help="sgd/lars momentum")
    run.add_argument("--temperature", type=float, default=default("temperature"),
                     help="loss temperature" + mode.temperature_help
                     + _kind_defaults_help(mode, "temperature"))
    run.add_argument("--matryoshka-dims", type=parse_dims, default=default("matryoshka_dims"),
                     help="Matryoshka: comma-separated embedding widths, largest first (e.g. 384,256,128,64): the loss "
                     "is summed over the first d columns of the embeddings for each d, and every held-out metric is "
                     "also reported at each d as <metric>@<d> (default: the full width only)")
    run.add_argument("--precision", default=default("precision"), choices=list(PRECISIONS),
                     help="encoders under autocast in bf16/fp16 (fp16 with a gradient scaler)")
    run.add_argument("--compile", action="store_true", help="torch.compile each encoder the strategy runs "
                     "(fullgraph=False, dynamic=None: a graph break runs its region eagerly, changing chunk shapes "
                     "compile once more with dynamic shapes); the same gradients, replay and recompute check as an "
                     "eager run; a backend that fails on the encoders stops the run with exit 2 (default: eager)")
    run.add_argument("--compile-backend", default=default("compile_backend"), metavar="BACKEND",
                     help="--compile: the torch.compile backend (inductor needs a C++ compiler on the CPU and "
                     "Triton on CUDA; aot_eager needs neither and fuses nothing)")
    run.add_argument("--device", default=default("device"), help="cpu, cuda or cuda:N")
    run.add_argument("--seed", type=int, default=default("seed"),
                     help="seed of initialisation, data order and augmentation")
    return run

def _sharding_options(parser: argparse.ArgumentParser, mode: Mode, default: Callable[[str], Any]) -> argparse._ArgumentGroup:
    """FSDP2 and the collectives, under torchrun."""
    shard = parser.add_argument_group("sharding (torchrun)")
    shard.add_argument("--fsdp", action="store_true", help="shard each encoder block by block with FSDP2 instead "
                       "of DDP; checkpoints become last.dcp (one shard per rank, resumable on any number of ranks); "
                       "without torchrun, a one-process gloo group is started")
    shard.add_argument("--fsdp-reduce", default=default("fsdp_reduce"), choices=list(FSDP_REDUCE_MODES),
                       help="--fsdp: reduce-scatter gradients after every chunk (chunk: sharded gradients) or once "
                       "per step (step: whole gradients between chunks, fewer collectives)")
    shard.add_argument("--cpu-offload", action="store_true", help="--fsdp: keep sharded parameters, gradients "
                       "and optimizer state in CPU memory; the optimizer steps on CPU")
    shard.add_argument("--deepspeed", metavar="CONFIG.json", default=default("deepspeed"),
                       help="train the encoder as a DeepSpeed ZeRO-1/2/3 engine configured by this JSON file (its "
                       "batch keys follow --batch-size; the program's --optimizer and schedule are used); checkpoints "
                       "become last.ds; without torchrun, a one-process gloo group is started (default: no DeepSpeed)")
    shard.add_argument("--collective-timeout", type=float, default=default("collective_timeout"),
                       help="seconds a collective waits for the other ranks before the step fails (a rank that "
                       "died or froze); longer than the slowest evaluation or save, which the others wait for")
    return shard

def _output_options(parser: argparse.ArgumentParser, mode: Mode, default: Callable[[str], Any]) -> argparse._ArgumentGroup:
    """The run folder, checkpoints, evaluation and logging."""
    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", default=None, help="run folder (default: runs/<mode>-<time>; "
                        "on --resume: the checkpoint's folder)")
    output.add_argument("--resume", default=None, help="continue from this checkpoint, or from a run folder's "
                        "newest good one (falling back to previous.pt with a warning); 'auto': from --output-dir's "
                        "if it holds one, else start afresh there (for torchrun --max-restarts); a larger --steps "
                        "or --epochs extends the run (default: start a new run)")
    output.add_argument("--checkpoint-every", type=int, default=default("checkpoint_every"),
                        help="save the checkpoint every N steps and at the end")
    output.add_argument("--eval-every", type=int, default=default("eval_every"),
                        help="evaluate every N steps (0: at start and end only)")
    output.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    output.add_argument("--progress-every", type=float, default=default("progress_every"), metavar="SECONDS",
                        help="when stderr is not a terminal (a cluster job's log, a pipe): a line with the step, "
                        "loss, samples/s and ETA every SECONDS instead of a progress bar (0: every step)")
    output.add_argument("--report-to", nargs="+", default=None, choices=list(REPORT_TO), metavar="{" +
                        ",".join(REPORT_TO) + "}", help="also log every row of train_log.csv and eval_log.csv, at the "
                        "same steps, as the scalars train/<column> and eval/<metric>: tensorboard writes "
                        "<output-dir>/tensorboard/ (view: tensorboard --logdir <output-dir>/tensorboard; needs "
                        "pip install tensorboard); wandb an offline W&B run in <output-dir>/wandb/ (upload: wandb "
                        "sync; WANDB_MODE=online logs it live; needs pip install wandb); rank 0 alone; a resume "
                        "continues them (default: none, the CSV logs only)")
    return output

def explicit_options(mode: Mode, argv: list[str]) -> set[str]:
    """The field of every option that `argv` spells out (abbreviations are disabled, so this is exact)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_train_options(probe, mode)
    return {action.dest for action in probe._actions
            if any(token == option or token.startswith(option + "=") for token in argv
                   for option in action.option_strings)}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig that a parsed `gradcache train <mode>` command line describes."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(**{k: v for k, v in vars(args).items() if k in names})


def _kind_defaults_help(mode: Mode, name: str) -> str:
    """The defaults of option `name` that text's `--kind`s set otherwise (`Mode.kind_defaults`), for its help."""
    from gradcache.train.modes import kinds_of

    kinds = [f"--kind {kind.kind} {kind.kind_defaults[name]}" for kind in kinds_of(mode) if name in kind.kind_defaults]
    return f"; a new run's default with {', '.join(kinds)} (the peers' scale)" if kinds else ""
