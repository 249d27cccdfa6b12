"""DeepSpeed's output on stderr: a command's stdout is its JSON alone (`gradcache train`'s summary, `gradcache
eval`'s metrics), but DeepSpeed prints to stdout (its communication backend's "built successfully" line) and its
logger ("DeepSpeed", made when deepspeed is first imported) writes to the stdout of that moment."""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

__all__ = ["deepspeed_output_to_stderr"]


@contextlib.contextmanager
def deepspeed_output_to_stderr() -> Iterator[None]:
    """Inside: `print` and DeepSpeed's logger write to stderr; both as they were after."""
    with contextlib.redirect_stdout(sys.stderr):
        moved = [(handler, handler.stream) for handler in logging.getLogger("DeepSpeed").handlers
                 if isinstance(handler, logging.StreamHandler) and handler.stream is not sys.stderr]
        for handler, _ in moved:
            _point(handler, sys.stderr)
        try:
            yield
        finally:
            for handler, stream in moved:
                _point(handler, stream)


def _point(handler: logging.StreamHandler, stream: object) -> None:
    """`handler` writing to `stream`; the stream it had is flushed first unless it was closed since deepspeed was
    imported (a caller's captured stdout: `main()` called from a test or a notebook)."""
    if getattr(handler.stream, "closed", False):
        handler.stream = stream
    else:
        handler.setStream(stream)
