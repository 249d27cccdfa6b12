"""A benchmark's output file written whole or not at all, never through a link: `replaced(path)` writes a temporary
file in `path`'s folder, flushes it to disk and renames it over `path`. A reader sees the old file or the new one;
a run stopped mid-write leaves the old one (and at worst a hidden `.NAME.*.tmp` beside it). Where `path` is a
symbolic link, the rename replaces the link itself with the new file: the file it pointed to is left untouched."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def replaced(path: str | os.PathLike, mode: str = "w", **open_options: Any) -> Iterator[IO]:
    """A file opened for writing (`mode` "w" or "wb", `open_options` as `open`'s) that becomes `path` when the
    block ends without an error; on an error `path` is as it was."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with open(descriptor, mode, **open_options) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644 & ~_umask())  # mkstemp's 0600 would hide results from the rest of a group
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_figure(figure: Any, path: str | os.PathLike, **options: Any) -> None:
    """matplotlib's `figure.savefig` into `path`, through `replaced` (format from the suffix)."""
    with replaced(path, "wb") as handle:
        figure.savefig(handle, format=Path(path).suffix.lstrip(".") or "png", **options)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
