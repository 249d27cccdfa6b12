"""The `gradcache` command: `gradcache train simclr|clip ...` and `gradcache eval CHECKPOINT`.

`main(argv=None) -> int` is the console script's entry point and what tests call. Exit status: 0 done; 2 bad
input (bad option, missing or unusable data, a checkpoint from another model, an output folder that already
holds a run), with a message on stderr and nothing written; 1 a run that diverged (non-finite loss), whose
last good checkpoint is kept. Subcommands register themselves through `SUBCOMMANDS`, one function each.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence

from gradcache.train.checkpoint import CheckpointError
from gradcache.train.cli_options import (
    UsageError,
    add_train_options,
    explicit_options,
    resolve_run_options,
    sharded_checkpoint,
)
from gradcache.train.datasets import DataError

Register = Callable[[argparse._SubParsersAction], None]


def _register_train(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a SimCLR or CLIP encoder (default: SimCLR on built-in shapes)",
                                description="Train with GradCache, plain accumulation or one full batch.")
    modes = train.add_subparsers(dest="mode", metavar="{simclr,clip}")
    for mode, summary in (("simclr", "SimCLR: two augmented views per image, NT-Xent loss"),
                          ("clip", "CLIP: image-caption pairs, symmetric contrastive loss with a learnable temperature")):
        parser = modes.add_parser(mode, help=summary, description=summary, allow_abbrev=False,
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_train_options(parser, mode)
        parser.set_defaults(command=_run_train)


def _register_eval(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("eval", help="evaluate a saved checkpoint on its run's held-out split",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint file (last.pt), a sharded checkpoint folder (last.dcp of an "
                        "--fsdp run), or a run folder holding either")
    parser.add_argument("--device", default="cpu", help="where to run the encoders")
    parser.add_argument("--output-json", default=None, help="also write the metrics to this JSON file")
    parser.set_defaults(command=_run_eval)


SUBCOMMANDS: list[Register] = [_register_train, _register_eval]


def get_args_parser() -> argparse.ArgumentParser:
    """The full `gradcache` parser; add a subcommand by appending its register function to SUBCOMMANDS."""
    parser = argparse.ArgumentParser(prog="gradcache", description="Large-batch contrastive learning under "
                                     "limited memory (GradCache).")
    commands = parser.add_subparsers(dest="subcommand", metavar="{train,eval}")
    for register in SUBCOMMANDS:
        register(commands)
    return parser


def _default_train_argv(argv: list[str]) -> list[str]:
    """`gradcache train` alone (or with options only) means `gradcache train simclr`."""
    if argv[:1] == ["train"] and (len(argv) == 1 or argv[1].startswith("-") and argv[1] not in ("-h", "--help")):
        return ["train", "simclr", *argv[1:]]
    return argv


def _run_train(args: argparse.Namespace, argv: list[str]) -> int:
    from gradcache.train.loop import TrainingDiverged, init_distributed_if_launched, train

    init_distributed_if_launched(args.device)
    args, checkpoint, data = resolve_run_options(args, explicit_options(get_args_parser(), argv))
    try:
        summary = train(args, checkpoint, data)
    except TrainingDiverged as error:
        print(f"gradcache train: {error}", file=sys.stderr)
        return 1
    if summary:
        print(json.dumps(summary, indent=2, sort_keys=True))
        checkpoint_name = "last.dcp" if args.fsdp else "last.pt"
        print(f"wrote {args.output_dir}/metrics.json, train_log.csv, eval_log.csv, curves.png, {checkpoint_name}",
              file=sys.stderr)
    return 0


def _run_eval(args: argparse.Namespace, argv: list[str]) -> int:
    import torch
    from torch import nn

    from gradcache.train.checkpoint import load_checkpoint
    from gradcache.train.recipe import build_loss, build_model, build_tokenizer, load_data
    from gradcache.train.run_eval import baseline_metrics, evaluate_model

    sharded = sharded_checkpoint(args.checkpoint)
    if sharded is not None:  # an --fsdp run's last.dcp: read its model's shards into one unsharded model
        from gradcache.train.fsdp import load_sharded_model, sharded_extra

        checkpoint = sharded_extra(sharded)
        run = argparse.Namespace(**checkpoint["args"])
        model = build_model(run)
        load_sharded_model(sharded, nn.ModuleDict({"model": model, "loss": build_loss(run)}))
    else:
        checkpoint = load_checkpoint(args.checkpoint)
        run = argparse.Namespace(**checkpoint["args"])
        model = build_model(run)
        model.load_state_dict(checkpoint["model"])
    run.device = args.device
    device = torch.device(args.device)
    data = load_data(run)
    model.to(device)
    metrics = {**evaluate_model(run, model, data, build_tokenizer(run), device),
               **(checkpoint.get("baselines") or baseline_metrics(run, data, device)), "steps": checkpoint["step"]}
    print(json.dumps(metrics, indent=2, sort_keys=True))
    if args.output_json:
        with open(args.output_json, "w") as handle:
            json.dump(metrics, handle, indent=2, sort_keys=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the subcommand, return its exit status."""
    argv = _default_train_argv(list(sys.argv[1:] if argv is None else argv))
    parser = get_args_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits 2 on a bad option and 0 on --help
        return int(exit_.code or 0)
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return args.command(args, argv)
    except (UsageError, DataError, CheckpointError) as error:
        print(f"gradcache: error: {error}", file=sys.stderr)
        return 2
