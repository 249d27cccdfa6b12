"""What a command writes: on stdout its JSON summary alone; everything else on stderr, whoever writes it; a
warning as one line, without the source line Python prints beneath it.

Third-party packages write to stdout: DeepSpeed's logger, made when deepspeed is first imported (transformers'
`save_pretrained` imports it whenever it is installed), and prints from C code. Inside `summary_on_stdout`
`sys.stdout` is stderr and, in the command's own process, so is file descriptor 1 (handles taken on the old
stdout, and C code, follow it); `print_summary` writes to a handle on the real stdout taken before.
An in-process `main([...])` (a test under pytest's capture) leaves descriptor 1 alone.
Inside `one_line_warnings`, each warning prints as `gradcache: warning: MESSAGE` (its category named when it is
not a UserWarning), once per place it is raised from, as the "default" filter shows them.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["one_line_warnings", "print_summary", "summary_on_stdout"]

_SUMMARY: list[TextIO] = []  # the real stdout of each open `summary_on_stdout`, innermost last


@contextlib.contextmanager
def summary_on_stdout(own_process: bool) -> Iterator[None]:
    """Inside: sys.stdout (and, with `own_process`, file descriptor 1) write to stderr; `print_summary` writes to
    the stdout of the moment it was entered. Both as they were after."""
    if sys.stdout is not None:  # None: Python started without a stdout
        sys.stdout.flush()
    try:
        saved = os.dup(1) if own_process else None
    except OSError:  # no descriptor 1 (stdout closed): Python-level writes only
        saved = None
    if saved is not None:
        real = os.fdopen(saved, "w", encoding="utf-8")
        os.dup2(2, 1)
    else:
        real = sys.stdout
    _SUMMARY.append(real if real is not None else sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _SUMMARY.pop()
        sys.stderr.flush()
        if real is not None:
            real.flush()
        if saved is not None:
            os.dup2(real.fileno(), 1)
            real.close()


def print_summary(summary: Any) -> None:
    """`summary` as indented JSON on the real stdout (sys.stdout outside `summary_on_stdout`)."""
    print(json.dumps(summary, indent=2, sort_keys=True), file=_SUMMARY[-1] if _SUMMARY else sys.stdout, flush=True)


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
    """`warnings.formatwarning` of a command: one line, no source file nor source line."""
    kind = "warning" if category is UserWarning else category.__name__
    return f"gradcache: {kind}: {message}\n"


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside: warnings shown once per place ("default") and as `warning_line`; the filters and the format as
    they were after."""
    formatting = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.formatwarning = warning_line
        try:
            yield
        finally:
            warnings.formatwarning = formatting
