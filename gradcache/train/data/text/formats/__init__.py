"""The text formats of `--data`, `--eval-data` and `--corpus`, one module each, registered in `FORMATS`.

Each answers the questions of text_format.py: its suffixes or folder test; indexed or streamed; for an indexed
format its records with offsets and a reader by offset, for a streamed one its lines from a line on. Adding a
format is a module and one line of `FORMATS`; everything else asks this table (`file_format`, `folder_format`,
`format_named`), never a suffix.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

from gradcache.train.data.text.formats.arrow_folder import ARROW_FOLDER
from gradcache.train.data.text.formats.delimited import CSV, TSV
from gradcache.train.data.text.formats.jsonl import JSONL
from gradcache.train.data.text.formats.jsonl_gz import JSONL_GZ
from gradcache.train.data.text.formats.parquet import PARQUET
from gradcache.train.data.text.formats.text_format import IndexedFormat, StreamedFormat, TextFormat
from gradcache.train.errors import DataError

__all__ = ["FORMATS", "IndexedFormat", "StreamedFormat", "TextFormat", "described", "file_format", "folder_format",
           "folder_names", "format_named", "file_suffixes", "is_text_lines", "listed", "table_records",
           "table_separator", "table_suffixes"]

FORMATS: list[TextFormat] = [  # in the order messages list them
    JSONL_GZ,
    JSONL,
    TSV,
    CSV,
    PARQUET,
    ARROW_FOLDER,
]
TEXT_LINES = ".txt"  # not a format of training rows: the plain texts `gradcache encode` embeds, one a line


def is_text_lines(path: str | os.PathLike) -> bool:
    """Whether `path` is a file of plain texts, one a line (`TEXT_LINES`)."""
    return str(path).lower().endswith(TEXT_LINES)


def file_suffixes(streamed: bool | None = None) -> list[str]:
    """Every file suffix a format reads, in table order ('.jsonl.gz', '.jsonl', ...); those of the streamed (or,
    False, the indexed) formats alone when `streamed` is given."""
    return [suffix for text_format in FORMATS for suffix in text_format.suffixes
            if streamed is None or text_format.streamed == streamed]


def folder_names(streamed: bool | None = None) -> list[str]:
    """What a data set folder of each folder format is called in messages ('a datasets folder'), in table order;
    those of the streamed (or, False, the indexed) formats alone when `streamed` is given."""
    return [text_format.folder for text_format in FORMATS
            if text_format.folder is not None and (streamed is None or text_format.streamed == streamed)]


def listed(words: list[str]) -> str:
    """`words` as a message lists them: 'a', 'a or b', 'a, b or c'."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def described(streamed: bool | None = None) -> str:
    """Every format of the table (the streamed, or False the indexed, alone when `streamed` is given) for help and
    errors: 'a .jsonl.gz, .jsonl, .tsv, .csv or .parquet file, or a datasets folder'."""
    folders = folder_names(streamed)
    return f"a {listed(file_suffixes(streamed))} file" + (f", or {listed(folders)}" if folders else "")


def table_suffixes() -> list[str]:
    """The suffixes of the text tables (`text_table` formats: what the commands read and `mine` writes)."""
    return [suffix for text_format in FORMATS if text_format.text_table for suffix in text_format.suffixes]


def file_format(path: str | os.PathLike) -> TextFormat | None:
    """The format of file `path` by its longest matching (case-insensitive) suffix, or None."""
    name = str(path).lower()
    matches = [(len(suffix), text_format) for text_format in FORMATS for suffix in text_format.suffixes
               if name.endswith(suffix)]
    return max(matches, key=lambda match: match[0])[1] if matches else None


def table_separator(path: str | os.PathLike) -> str:
    """The field separator of the delimited table `path`: its format's (a tab for .tsv), else a comma."""
    return getattr(file_format(path), "separator", ",")


def folder_format(path: Path) -> TextFormat | None:
    """The format whose one data set folder `path` is, or None."""
    return next((text_format for text_format in FORMATS if text_format.is_folder(path)), None)


def format_named(name: str) -> TextFormat | None:
    """The format whose key (`name`, as data_index.npz records it) is `name`, or None."""
    return next((text_format for text_format in FORMATS if text_format.name == name), None)


def table_records(path: str | os.PathLike, option: str = "--data") -> tuple[list[tuple[str, dict]], set[str]]:
    """(where, record) for every row of a text table (a .tsv, .csv or .jsonl file), and every column or field name
    seen; `option` names the file's option in errors. Every record in memory: for small files (the commands'
    inputs)."""
    path = Path(path)
    text_format = file_format(path)
    if text_format is None or not text_format.text_table:
        raise DataError(f"{option} {str(path)!r}: unknown extension {path.suffix.lower()!r}; give a "
                        f"{listed(table_suffixes())} file")
    records = text_format.records(path, ("", "", ()))
    try:
        rows = [(f"line {line}", record) for _, line, record in records]
    except DataError:
        raise
    except (OSError, ValueError, csv.Error) as error:
        raise DataError(f"cannot read {path}: {error}") from error
    return rows, records.names
