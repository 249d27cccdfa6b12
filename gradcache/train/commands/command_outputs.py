"""Outputs written whole or not at all: into a temporary file beside the target, renamed over it at the end, so
a command that fails (or is interrupted) leaves no partial file and never damages an existing one."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gradcache.train.errors import OutputDiskFull, UsageError, out_of_space


def check_output(path: str | os.PathLike, suffixes: tuple[str, ...], option: str = "--output") -> Path:
    """`path` ends in one of `suffixes` and its folder exists (checked before any work is done).

    Raises:
        UsageError: another extension, or no such folder.
    """
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {str(path)!r}: unknown extension {path.suffix!r}; give a file ending in "
                         f"{', '.join(suffixes)}")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {str(path)!r}: the folder {str(path.parent)!r} does not exist; create it first")
    return path


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write(temporary)` fills a temporary file beside `path`, which then replaces `path` in one rename.

    Raises:
        OutputDiskFull: the disk filled (exit status 74), whatever error the writing library made of it; `path`
            is as it was and no temporary file is left.
    """
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp creates 0600; the user's umask decides, as for open()
        os.replace(temporary, path)
    except Exception as error:
        written = Path(temporary).stat().st_size if Path(temporary).exists() else 0
        Path(temporary).unlink(missing_ok=True)
        if out_of_space(error, path.parent, written):  # numpy's OSError, or faiss's bare RuntimeError
            raise OutputDiskFull(path, written, shutil.disk_usage(path.parent).free) from error
        raise
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
