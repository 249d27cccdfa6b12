"""The `gradcache` command: `gradcache train <mode> ...` and `gradcache eval CHECKPOINT`.

`main(argv=None) -> int` is the console script's entry point and what tests call. It returns the exit status
that the raised error's type carries (gradcache/train/errors.py, where every status is explained), with one
line on stderr and never a traceback; an error no command raises on purpose is a bug and keeps its traceback.
Subcommands register themselves through `SUBCOMMANDS`, one function each. The library needs torch alone; these
commands need the `train` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence

Register = Callable[[argparse._SubParsersAction], None]
# the import names of the `train` extra's packages (pyproject.toml)
TRAIN_EXTRA = {"torchvision", "numpy", "PIL", "faiss", "tqdm", "matplotlib", "sklearn"}


def _register_train(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.arguments import HelpFormatter, add_train_options
    from gradcache.train.modes import MODES

    train = commands.add_parser("train", help="train an encoder (default: SimCLR on built-in shapes)",
                                description="Train with GradCache, plain accumulation or one full batch.")
    modes = train.add_subparsers(dest="mode", metavar="{" + ",".join(MODES) + "}")
    for mode in MODES.values():
        parser = modes.add_parser(mode.name, help=mode.help, description=mode.help, allow_abbrev=False,
                                  formatter_class=HelpFormatter)
        add_train_options(parser, mode)
        parser.set_defaults(command=_run_train)


def _register_eval(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("eval", help="evaluate a saved checkpoint on its run's held-out split",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint file (last.pt), a sharded checkpoint folder (last.dcp of an "
                        "--fsdp run), or a run folder holding either (its newest good checkpoint: a damaged last.pt "
                        "falls back to previous.pt, with a warning)")
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
    from gradcache.train.arguments import config_from_args, explicit_options
    from gradcache.train.loop import train
    from gradcache.train.modes import MODES
    from gradcache.train.parallel.placement import collective_failures, launched_process_group
    from gradcache.train.preflight import prepare_run

    # torchrun's process group for the command, ended with it; a failed collective (a rank died or froze) typed,
    # from the checks' first broadcast on
    with launched_process_group(args.device, args.collective_timeout), collective_failures(args.collective_timeout):
        config, saved, data, lock = prepare_run(config_from_args(args), explicit_options(MODES[args.mode], argv))
        with lock:  # one job per run folder until this one ends
            summary = train(config, saved, data)
    if summary:
        print(json.dumps(summary, indent=2, sort_keys=True))
        print(f"wrote {config.output_dir}/metrics.json, train_log.csv, eval_log.csv, curves.png, "
              f"{'last.dcp' if config.fsdp else 'last.pt'}", file=sys.stderr)
    return 0


def _run_eval(args: argparse.Namespace, argv: list[str]) -> int:
    import dataclasses

    import torch
    from torch import nn

    from gradcache.train.checkpoints.kinds import open_checkpoint
    from gradcache.train.checkpoints.meta import CheckpointMeta
    from gradcache.train.modes import MODES
    from gradcache.train.run import build_loss, build_model

    saved = open_checkpoint(args.checkpoint)
    meta = CheckpointMeta.from_dict(saved.meta(), saved)
    config = dataclasses.replace(meta.config, device=args.device)
    mode = MODES[config.mode]
    model = build_model(mode, config)
    saved.load(nn.ModuleDict({"model": model, "loss": build_loss(mode, config)}))  # shards into one model
    device = torch.device(args.device)
    data = mode.load_data(config)
    metrics = {**mode.evaluate(config, model.to(device), data, device), **meta.baselines, "steps": meta.step}
    print(json.dumps(metrics, indent=2, sort_keys=True))
    if args.output_json:
        with open(args.output_json, "w") as handle:
            json.dump(metrics, handle, indent=2, sort_keys=True)
    return 0




def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the subcommand, return its exit status."""
    try:
        from gradcache.train import errors

        parser = get_args_parser()
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in TRAIN_EXTRA:
            raise
        print(f"gradcache: the training program needs {error.name}, which is not installed (the library alone "
              "needs torch only); install the program's packages with: pip install 'gradcache[train]'",
              file=sys.stderr)
        return errors.USAGE
    argv = _default_train_argv(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits 2 on a bad option and 0 on --help
        return int(exit_.code or 0)
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return errors.USAGE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return args.command(args, argv)
    except KeyboardInterrupt as error:  # Ctrl-C outside the training loop (within it: preemption.py)
        print(f"gradcache: interrupted{f' ({error})' if str(error) else ''}; stopped at once without saving (a "
              "run's previous checkpoint, if it has one, is intact)", file=sys.stderr)
        return errors.INTERRUPTED
    except Exception as error:
        status = errors.exit_status_of(error)
        if status is None:  # not raised on purpose: a bug, shown with its traceback
            raise
        if getattr(error, "rank", 0) == 0:  # a pre-emption's message: once, from rank 0
            print(f"gradcache: {'error: ' if status == errors.USAGE else ''}{error}", file=sys.stderr)
        if status == errors.COLLECTIVE_TIMEOUT:
            # The process group is broken and gloo's threads still wait on the dead peer: at the interpreter's
            # exit their C++ destructors abort the process (SIGABRT, not this status). Everything of the run has
            # been unwound by now (checkpoint, log, lock), so leave at once, as NCCL's watchdog would.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
