"""`.jsonl.gz`: gzipped JSON lines, streamed (a gzip file has no offsets to seek to: streamed_rows.py)."""
from __future__ import annotations

import gzip
import os
import zlib
from typing import BinaryIO

from gradcache.train.data.text.formats.text_format import StreamedFormat


class JsonlGz(StreamedFormat):
    name = ".jsonl.gz"
    suffixes = (".jsonl.gz",)
    read_errors = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError; a file cut short: EOFError
    decompress_command = "gunzip"

    def open(self, path: str | os.PathLike) -> BinaryIO:
        return gzip.open(path, "rb")


JSONL_GZ = JsonlGz()
