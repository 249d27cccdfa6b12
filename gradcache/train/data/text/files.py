"""Which files `--data` (or `--eval-data`) names: one file, a folder, a glob, or a brace pattern, as one ordered set.

- A folder that is one data set of a format (formats/arrow_folder.py: what `datasets` save_to_disk wrote).
- Another folder: its files of a registered format, sorted by name (not recursive).
- A brace pattern expands first, as a shell does: 'part-{000..099}.jsonl' (a numeric range keeps the width of
  its zero-padded ends), 'pairs-{train,extra}.tsv' (a list). Each expansion may then be a glob ('*', '?', '[').
- A glob matches files, sorted by name; a plain path must exist.
The files of one set share one format (formats/__init__.py's `FORMATS`, told by suffix), returned by its name.
Nothing matched, a missing plain path or mixed formats raise `DataError`, naming the pattern and the fix.
"""
from __future__ import annotations

import glob
import re
from pathlib import Path

from gradcache.train.data.text.formats import file_format, file_suffixes, folder_format
from gradcache.train.errors import DataError

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Every expansion of the first brace group of `pattern`, recursively: 'a{1..3}b' -> ['a1b', 'a2b', 'a3b']."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    inner, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    numeric = _RANGE.match(inner)
    if numeric:
        first, last = int(numeric.group(1)), int(numeric.group(2))
        width = max(len(numeric.group(1)), len(numeric.group(2))) if numeric.group(1).startswith("0") else 0
        step = 1 if last >= first else -1
        choices = [f"{value:0{width}d}" for value in range(first, last + step, step)]
    elif "," in inner:
        choices = inner.split(",")
    else:
        return [head + "{" + inner + "}" + expansion for expansion in expand_braces(tail)]  # a literal brace
    return [expansion for choice in choices for expansion in expand_braces(head + choice + tail)]


def data_files(pattern: str | Path, option: str = "--data") -> tuple[list[Path], str]:
    """The files `pattern` names (module docstring) and the name of their one format.

    Raises:
        DataError: nothing matched, a plain path that does not exist, a file of no known format, or files of
            more than one format (the message names `option`, the pattern and the fix).
    """
    text = str(pattern)
    known = ", ".join(file_suffixes())
    folder = folder_format(Path(text))
    if folder is not None:
        return [Path(text)], folder.name
    if Path(text).is_dir():
        files = sorted(path for path in Path(text).iterdir() if path.is_file() and file_format(path))
        if not files:
            raise DataError(f"{option} {text!r} is a folder holding no {known} file; give a folder of such files, "
                            "a file, or a pattern")
    else:
        files = []
        for expansion in expand_braces(text):
            if Path(expansion).is_file():  # before the glob: a file name may hold '[' or '?'
                files.append(Path(expansion))
            elif any(character in expansion for character in "*?["):
                files.extend(sorted(Path(name) for name in glob.glob(expansion) if Path(name).is_file()))
            elif expansion == text:
                raise DataError(f"{option} {text!r} is not a file; give a {known} file of text pairs, a folder, "
                                "or a glob or brace pattern such as 'pairs/part-{000..099}.jsonl'")
            else:
                raise DataError(f"{option} {text!r}: {expansion!r} (one of its expansions) is not a file; fix the "
                                "pattern or add the file")
        if not files:
            raise DataError(f"{option} {text!r} matches no file; check the pattern (quote it so the shell does not "
                            "expand it)")
    found = {path: file_format(path) for path in files}
    unknown = next((path for path, text_format in found.items() if text_format is None), None)
    if unknown is not None:
        raise DataError(f"{option} {str(unknown)!r}: unknown extension {unknown.suffix.lower()!r}; give a "
                        f"{', '.join(file_suffixes())} file")
    formats = {text_format.name for text_format in found.values()}
    if len(formats) > 1:
        raise DataError(f"{option} {text!r} mixes formats ({', '.join(sorted(formats))}); give files of one format, "
                        "e.g. a narrower pattern")
    return files, formats.pop()
