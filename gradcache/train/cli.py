"""The `gradcache` command: `gradcache train <mode> ...`, `gradcache eval MODEL`, `gradcache export RUN`,
`gradcache encode MODEL` and `gradcache mine MODEL` (their work lives in
gradcache/train/commands/, writing a model folder in gradcache/train/export/).

`main(argv=None) -> int` is the console script's entry point and what tests call. It returns the exit status
that the raised error's type carries (gradcache/train/errors.py, where every status is explained), with one
line on stderr and never a traceback; an error no command raises on purpose is a bug and keeps its traceback.
Subcommands register themselves through `SUBCOMMANDS`, one function each. The library needs torch alone; these
commands need the `train` extra.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence

from gradcache.train.command_output import one_line_warnings, print_summary, summary_on_stdout
from gradcache.train.installation import torchvision_mismatch

Register = Callable[[argparse._SubParsersAction], None]
# the import names of the `train` extra's packages (pyproject.toml)
TRAIN_EXTRA = {"torchvision", "numpy", "PIL", "faiss", "tqdm", "matplotlib", "sklearn"}


def _register_train(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.train_options import HelpFormatter, add_train_options
    from gradcache.train.modes import MODES

    train = commands.add_parser("train", help="train an encoder (default: SimCLR on built-in shapes); "
                                "gradcache train MODE --help: every option of a mode",
                                usage="gradcache train [MODE] [OPTIONS]",
                                description="Train with GradCache, plain accumulation or one full batch.",
                                epilog="Every option of a mode, with its default: gradcache train MODE --help (e.g. "
                                "gradcache train text --help). Without a mode (gradcache train, or options alone): "
                                "simclr.")
    modes = train.add_subparsers(dest="mode", metavar="MODE", title="modes")
    for mode in MODES.values():
        parser = modes.add_parser(mode.name, prog=f"gradcache train {mode.name}", help=mode.help,
                                  description=mode.help, allow_abbrev=False, formatter_class=HelpFormatter)
        add_train_options(parser, mode)
        parser.set_defaults(command=_run_train)


def _register_eval(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.commands.command_options import add_eval_options

    parser = commands.add_parser("eval", help="score a model (a run, a model folder) on a run's held-out split or "
                                 "on any --data file", description="Score MODEL: a run on its own held-out split, "
                                 "or any model on --data. Prints the metrics as one JSON object (percent).")
    add_eval_options(parser)
    parser.set_defaults(command=_run_eval)


def _register_encode(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.commands.command_options import add_encode_options

    parser = commands.add_parser("encode", help="embed texts or images to a .npy array or a .faiss index (a SPLADE "
                                 "model: its sparse rows to a .npz)", description="Embed every row of --data with "
                                 "MODEL, in input order, L2-normalised (a SPLADE model: its sparse rows as it gives "
                                 "them).")
    add_encode_options(parser)
    parser.set_defaults(command=_run_encode)


def _register_mine(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.commands.command_options import add_mine_options

    parser = commands.add_parser("mine", help="mine hard negatives for (query, positive) rows, for train "
                                 "--negative-keys", description="For each row, the --negatives highest-scoring "
                                 "passages of the corpus that are not its positive, behind the false-negative guards.")
    add_mine_options(parser)
    parser.set_defaults(command=_run_mine)


def _register_export(commands: argparse._SubParsersAction) -> None:
    from gradcache.train.train_options import HelpFormatter

    parser = commands.add_parser("export", help="write a run's model in the format its users load (RUN/model)",
                                 description="Write a checkpoint's model, weights only, as a sentence-transformers "
                                 "folder (text), open_clip's files (clip --model open_clip:ARCH) or gradcache's "
                                 "built-in format (clip, simclr); every run also writes RUN/model/ at its end.",
                                 formatter_class=HelpFormatter)
    parser.add_argument("run", help="a run folder of gradcache train (it may still be running)")
    parser.add_argument("--checkpoint", default="last", help="last (the newest good checkpoint), previous, or a "
                        "checkpoint file or folder (last.pt, previous.pt, last.dcp, last.ds)")
    parser.add_argument("--output", default=None, help="the folder to write, replaced whole if an earlier export "
                        "wrote it (default: RUN/model)")
    parser.set_defaults(command=_run_export)


SUBCOMMANDS: list[Register] = [_register_train, _register_eval, _register_export, _register_encode, _register_mine]


def get_args_parser() -> argparse.ArgumentParser:
    """The full `gradcache` parser; add a subcommand by appending its register function to SUBCOMMANDS."""
    parser = argparse.ArgumentParser(prog="gradcache", description="Large-batch contrastive learning under "
                                     "limited memory (GradCache).")
    commands = parser.add_subparsers(dest="subcommand", metavar="{train,eval,export,encode,mine}")
    for register in SUBCOMMANDS:
        register(commands)
    return parser


def _default_train_argv(argv: list[str]) -> list[str]:
    """`gradcache train` alone (or with options only) means `gradcache train simclr`."""
    if argv[:1] == ["train"] and (len(argv) == 1 or argv[1].startswith("-") and argv[1] not in ("-h", "--help")):
        from gradcache.train.modes import DEFAULT_MODE

        return ["train", DEFAULT_MODE, *argv[1:]]
    return argv


def _run_train(args: argparse.Namespace, argv: list[str]) -> int:
    from gradcache.train.train_options import config_from_args, explicit_options
    from gradcache.train.loop import train
    from gradcache.train.modes import MODES
    from gradcache.train.parallel.placement import (
        collective_failures,
        launched_process_group,
    )
    from gradcache.train.preflight import prepare_run
    from gradcache.train.run_folder.reporters import reporters_of

    # torchrun's process group for the command, ended with it; a failed collective (a rank died or froze) typed,
    # from the checks' first broadcast on
    with launched_process_group(args.device, args.collective_timeout), collective_failures(args.collective_timeout):
        config, saved, data, lock = prepare_run(config_from_args(args), explicit_options(MODES[args.mode], argv))
        with lock:  # one job per run folder until this one ends
            summary = train(config, saved, data)
    if summary:
        print_summary(summary)
        reported = "".join(f", {name}/" for name in reporters_of(config.report_to))
        print(f"wrote {config.output_dir}/metrics.json, train_log.csv, eval_log.csv, curves.png, "
              f"{'last.ds' if config.deepspeed else 'last.dcp' if config.fsdp else 'last.pt'}, model/{reported}",
              file=sys.stderr)
    return 0


def _run_eval(args: argparse.Namespace, argv: list[str]) -> int:
    from gradcache.train.commands.command_options import EVAL_OPTIONS, check_options
    from gradcache.train.commands.evaluate import evaluate
    from gradcache.train.commands.model import load_model

    check_options(args, EVAL_OPTIONS)
    model = load_model(args.model, args.device, args.max_length, args.pooling, args.query_prompt,
                       args.passage_prompt)
    metrics = evaluate(model, args.data, args.output, args.corpus, args.query_key, args.positive_key,
                       args.negative_keys, args.test_size, args.batch_size, args.classes)
    print_summary(metrics)
    return 0


def _run_encode(args: argparse.Namespace, argv: list[str]) -> int:
    from gradcache.train.commands.command_options import ENCODE_OPTIONS, check_options
    from gradcache.train.commands.encode import describe, encode, rows_written
    from gradcache.train.commands.model import load_model

    check_options(args, ENCODE_OPTIONS)
    model = load_model(args.model, args.device, args.max_length, args.pooling, args.query_prompt,
                       args.passage_prompt)
    embeddings = encode(model, args.data, args.output, args.key, args.image_key, args.tower, args.batch_size,
                        args.pair_keys)
    what = describe(model, embeddings)
    print(f"wrote {args.output}: {what} ({model.source})", file=sys.stderr)
    print_summary({"output": str(args.output), "rows": rows_written(embeddings), "model": str(model.source)})
    return 0


def _run_mine(args: argparse.Namespace, argv: list[str]) -> int:
    from gradcache.train.commands.command_options import MINE_OPTIONS, check_options
    from gradcache.train.commands.mine import Guards, mine, negative_keys_of
    from gradcache.train.commands.model import load_model

    check_options(args, MINE_OPTIONS)
    guards = Guards(args.margin, args.relative_margin, *(args.range or (1, None)))
    guards.check()
    model = load_model(args.model, args.device, args.max_length, args.pooling, args.query_prompt,
                       args.passage_prompt)
    mined = mine(model, args.data, args.output, args.negatives, guards, args.corpus, args.query_key,
                 args.positive_key, args.negative_keys, args.batch_size, args.replace_negatives)
    keys = negative_keys_of(args.output, mined.width)
    kept = (f"each row's own negatives ({', '.join(mined.kept_keys)}) kept first, the mined ones after; "
            if mined.kept_keys else "")
    print(f"wrote {args.output}: {mined.rows} rows, {mined.short} where mining found fewer than {args.negatives} "
          f"negatives; {kept}train on it with --data {args.output} --query-key {args.query_key} --positive-key "
          f"{args.positive_key} --negative-keys {keys}", file=sys.stderr)
    print_summary({"output": str(args.output), "rows": mined.rows, "short": mined.short, "negative_keys": keys})
    return 0


def _run_export(args: argparse.Namespace, argv: list[str]) -> int:
    from pathlib import Path

    from gradcache.train.commands.export import choose_checkpoint, export_checkpoint, written_by_a_kind
    from gradcache.train.export.write import MODEL_FOLDER, check_output

    output = args.output if args.output is not None else Path(args.run) / MODEL_FOLDER
    check_output(output, written_by_a_kind)  # before reading anything
    saved = choose_checkpoint(args.run, args.checkpoint)
    written = export_checkpoint(saved, output)
    print(f"wrote {written} from {saved}", file=sys.stderr)
    print_summary({"model": str(written), "checkpoint": str(saved)})
    return 0


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the command `argv` names (`gradcache train simclr`'s, `gradcache eval`'s)."""
    for token in argv:
        commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is None or token not in commands.choices:
            break
        parser = commands.choices[token]
    return parser


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """The usage of the command and the error for its `unknown` arguments, with the closest option of that
    command for each misspelt one (`--chunk_size`: `--chunk-size`), where argparse would give the top-level
    usage of `gradcache` and no hint."""
    options = [name for action in parser._actions for name in action.option_strings if name.startswith("--")]
    guesses = []
    for token in unknown:
        name = token.split("=", 1)[0]
        close = difflib.get_close_matches(name.replace("_", "-"), options, n=1, cutoff=0.8) if name[:2] == "--" else []
        guesses += [(name, close[0])] if close else []
    hint = ""
    if len(guesses) == 1:
        hint = f" (did you mean {guesses[0][1]}?)"
    elif guesses:
        hint = f" (did you mean {', '.join(f'{right} for {wrong}' for wrong, right in guesses)}?)"
    return (f"usage: {parser.prog} [OPTIONS] (every option: {parser.prog} --help)\n"
            f"{parser.prog}: error: unrecognized arguments: {' '.join(unknown)}{hint}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the subcommand, return its exit status."""
    try:
        from gradcache.train import errors

        mismatch = torchvision_mismatch()  # before the parser, whose modes import torchvision
        if mismatch is not None:
            print(f"gradcache: error: {mismatch}", file=sys.stderr)
            return errors.USAGE
        parser = get_args_parser()
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in TRAIN_EXTRA:
            raise
        print(f"gradcache: the training program needs {error.name}, which is not installed (the library alone "
              "needs torch only); install the program's packages with: pip install 'gradcache[train]'",
              file=sys.stderr)
        return errors.USAGE
    own_process = argv is None  # the console script: file descriptor 1 is this command's own
    argv = _default_train_argv(list(sys.argv[1:] if argv is None else argv))
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as exit_:  # argparse exits 2 on a bad option and 0 on --help
        return int(exit_.code or 0)
    if unknown:
        print(_unrecognized(_command_parser(parser, argv), unknown), file=sys.stderr)
        return errors.USAGE
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return errors.USAGE
    try:
        # stdout: the command's JSON summary alone; anything else written there goes to stderr
        with one_line_warnings(), summary_on_stdout(own_process=own_process):
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
