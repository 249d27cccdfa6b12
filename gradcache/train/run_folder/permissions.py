"""Files the program creates get the permissions the user's umask gives any new file: 0644 under the usual
umask 022. `tempfile` creates its files 0600 and its folders 0700 (private by design, since it cannot know what
they will hold); a file written to a temporary name and renamed into place keeps those, so the program sets
them back to what an ordinary `open()` (0666 & ~umask) or `mkdir()` (0777 & ~umask) would have made. A run's
checkpoint is no secret of the user's own files: it holds the same weights as the exported model beside it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else by setting it back at once."""
    try:
        match = re.search(r"^Umask:\s*([0-7]+)$", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        match = None
    if match:
        return int(match.group(1), 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_if_created(path: str | os.PathLike) -> None:
    """Give the file or folder `path` the mode `open()` or `mkdir()` would have given it under the umask."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~current_umask())
