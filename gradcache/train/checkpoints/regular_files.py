"""A checkpoint's files as the program reads them: regular files, never through a link, each opened once.

What is checked must be what is loaded. A path read twice (once to check it, once to load it) can name another
file the second time: whoever can write the run folder renames a file over it between the two reads. So a
single-file checkpoint is opened once (`open_regular`) and read, checked and loaded through that descriptor; and
the files of a checkpoint that another library reads by path (DeepSpeed's, `torch.distributed.checkpoint`'s) are
copied once, each read once and hashed as it is copied, into a folder that this process alone can write
(`PrivateCopy`, a 0700 temporary folder under `TMPDIR`), which that library is then given. A link or anything but
a regular file (a FIFO, a socket, a device) among them is refused by name: a run never writes one, and a link
would let whoever can write its target, outside the run folder, change what is read.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from gradcache.train.errors import CheckpointError

BLOCK = 1 << 20  # bytes read at a time


def open_regular(path: str | os.PathLike, checkpoint: str | os.PathLike | None = None) -> BinaryIO:
    """`path` opened for reading, if it is a regular file and not a link (of the checkpoint `checkpoint`, for the
    message). Opening never blocks (a FIFO is refused, not waited on).

    Raises:
        CheckpointError: missing, a link, or not a regular file, naming it.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        where = f"checkpoint {str(checkpoint)!r}: {str(path)!r}" if checkpoint else f"checkpoint {str(path)!r}"
        raise CheckpointError(f"{where} does not exist") from None
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            raise CheckpointError(_link(path, checkpoint)) from None
        raise CheckpointError(f"checkpoint {str(checkpoint or path)!r}: cannot open {str(path)!r} "
                              f"({error.strerror or error})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        if stat.S_ISDIR(mode):
            raise CheckpointError(f"checkpoint {str(path)!r} is a folder, not a checkpoint file")
        raise CheckpointError(_not_regular(path, checkpoint))
    return os.fdopen(descriptor, "rb")


def regular_files(folder: str | os.PathLike, checkpoint: str | os.PathLike) -> list[str]:
    """The files under `folder` (paths relative to it, sorted), none followed through a link.

    Raises:
        CheckpointError: `folder` or anything under it is a link, or neither a folder nor a regular file, naming it.
    """
    folder = Path(folder)
    if folder.is_symlink():
        raise CheckpointError(_link(folder, checkpoint))
    found = []
    for parent, folders, files in os.walk(folder, followlinks=False):
        for name in sorted(folders + files):
            path = Path(parent, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise CheckpointError(_link(path, checkpoint))
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise CheckpointError(_not_regular(path, checkpoint))
            if stat.S_ISREG(mode):
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


class PrivateCopy:
    """A fresh folder that this process alone can write (`folder`), into which `add` copies files of a checkpoint,
    each read once, through a descriptor opened without following links, and hashed as it is copied (`sha256`, by
    the name it has in the copy). Removed by `close` (and when collected)."""

    def __init__(self, checkpoint: str | os.PathLike) -> None:
        self.checkpoint = checkpoint
        self._folder = tempfile.TemporaryDirectory(prefix="gradcache-checkpoint-")  # mode 0700
        self.folder = Path(self._folder.name)
        self.sha256: dict[str, str] = {}

    def add(self, source: str | os.PathLike, names: list[str], under: str = "") -> None:
        """Copy the files `names` of the folder `source` into `folder / under`.

        Raises:
            CheckpointError: one is missing, a link, or not a regular file, naming it.
        """
        for name in names:
            copied = f"{under}/{name}" if under else name
            self.sha256[copied] = _copy(Path(source) / name, self.folder / copied, self.checkpoint)

    def close(self) -> None:
        self._folder.cleanup()


def _copy(source: Path, target: Path, checkpoint: str | os.PathLike) -> str:
    """Copy `source` to the new file `target`, returning the sha256 of the bytes copied."""
    if source.parent.is_symlink():
        raise CheckpointError(_link(source.parent, checkpoint))
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open_regular(source, checkpoint) as reader, open(target, "xb") as writer:
        for block in iter(lambda: reader.read(BLOCK), b""):
            digest.update(block)
            writer.write(block)
    return digest.hexdigest()


def _link(path: Path, checkpoint: str | os.PathLike | None) -> str:
    return (f"checkpoint {str(checkpoint or path)!r}: {str(path)!r} is a symbolic link; a run never writes one, "
            "and whoever can write what it points to could change what is loaded. It is not read: replace it by "
            "the file itself, or resume from another checkpoint")


def _not_regular(path: Path, checkpoint: str | os.PathLike | None) -> str:
    return (f"checkpoint {str(checkpoint or path)!r}: {str(path)!r} is not a regular file (a FIFO, socket or "
            "device); a run never writes one, and it is not read: remove it, or resume from another checkpoint")

