"""`gradcache bench memory|quality|peers [ARGS...]`: run a benchmark script of the source checkout.

The scripts live in the checkout's `benchmarks/` folder, beside the package (they are not installed with
it): `memory` is negatives_vs_memory.py, `quality` quality_vs_negatives.py, `peers` peers.py. The remaining
arguments go to the script unchanged (`gradcache bench memory --help` shows its options). Exit status 2 when
the scripts are not there, e.g. when gradcache was installed from a wheel rather than from its checkout.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import gradcache

SCRIPTS = {
    "memory": ("negatives_vs_memory.py", "peak memory and step time against negatives per anchor"),
    "quality": ("quality_vs_negatives.py", "kNN top-1 of FullBatch, plain accumulation and GradCache"),
    "peers": ("peers.py", "against sentence-transformers' cached loss and open_clip's ClipLoss"),
}


def benchmarks_dir() -> Path:
    """The source checkout's `benchmarks/` folder: one level above the installed (editable) package."""
    return Path(gradcache.__file__).resolve().parents[1] / "benchmarks"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` with one sub-command per script; each passes its remaining arguments to the script."""
    bench = subparsers.add_parser("bench", help="run a benchmark of the source checkout (memory, quality, peers)",
                                  description=__doc__.split("\n\n")[0])
    scripts = bench.add_subparsers(dest="benchmark", metavar="{" + ",".join(SCRIPTS) + "}")
    for name, (filename, summary) in SCRIPTS.items():
        parser = scripts.add_parser(name, help=summary, description=f"{summary} (benchmarks/{filename})",
                                    add_help=False, prefix_chars="+")  # every "-" option belongs to the script
        parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")
        parser.set_defaults(command=run_benchmark)
    bench.set_defaults(command=_missing_benchmark)


def _missing_benchmark(args: argparse.Namespace, argv: list[str]) -> int:
    print(f"gradcache bench: name a benchmark: one of {sorted(SCRIPTS)}", file=sys.stderr)
    return 2


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the chosen script with `sys.argv` set to its name and arguments; return its exit status."""
    folder = benchmarks_dir()
    script = folder / SCRIPTS[args.benchmark][0]
    if not script.is_file():
        print(f"gradcache bench: {script} not found; the benchmarks ship with the source checkout: clone the "
              f"repository and `pip install -e .` from it.", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args.script_args]
    sys.path.insert(0, str(folder))  # the scripts import their sibling modules, as when run directly
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0
