"""A passage corpus of (id, text) rows (`--corpus`), looked up by id without holding its texts (tevatron's layout).

The corpus: a .jsonl, .tsv or .csv file (or a folder or pattern of them) whose rows have the fields `id` and
`text` (a row without either is skipped and counted). Training rows then name their passages by id instead of
holding them: `positive_id` (one id) and `negative_ids` (a list of ids, or one id); an id is compared as text
(JSON 7 and "7" are one id). An id a training row names that the corpus lacks is an error, not a skip.

Kept in memory per passage: its row index's byte offset and a 64-bit hash of its id with the position that
sorts them (24 bytes); `position(id)` finds the hash by binary search and confirms the id by reading the row.
Positions follow the sorted hashes: `passage(p)` for p in range(len) visits every passage once (the retrieval
corpus of the evaluation).
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gradcache.train.data.text.formats import StreamedFormat, format_named
from gradcache.train.data.text.row_index import RowIndex, build_row_index
from gradcache.train.data.text.usable_rows import clean_text
from gradcache.train.errors import DataError

CORPUS_ID_KEY, CORPUS_TEXT_KEY = "id", "text"
POSITIVE_ID_KEY, NEGATIVE_IDS_KEY = "positive_id", "negative_ids"


def id_hash(passage_id: str) -> int:
    """A 64-bit hash of an id (blake2b: the same in every process, unlike `hash`)."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


class PassageCorpus:
    """Passages by id (module docstring): `len`, `position(id)`, `passage(position)`, `contains_hash(id)`."""

    def __init__(self, rows: RowIndex, hashes: np.ndarray, order: np.ndarray, name: str) -> None:
        self.rows, self.hashes, self.order, self.name = rows, hashes, order, name  # hashes sorted; order: row of each

    def __len__(self) -> int:
        return len(self.order)

    def contains_hash(self, passage_id: str) -> bool:
        """Whether an id with `passage_id`'s hash is in the corpus (no read: what indexing checks)."""
        value = id_hash(passage_id)
        place = int(np.searchsorted(self.hashes, value))
        return place < len(self.hashes) and int(self.hashes[place]) == value

    def position(self, passage_id: str) -> int | None:
        """The position of the passage `passage_id`, or None if the corpus has none."""
        value = id_hash(passage_id)
        first, last = np.searchsorted(self.hashes, value, "left"), np.searchsorted(self.hashes, value, "right")
        for position in range(int(first), int(last)):
            if self.rows.row(int(self.order[position]))[0] == passage_id:
                return position
        return None

    def passage(self, position: int) -> str:
        return self.rows.row(int(self.order[position]))[1]

    def __getitem__(self, position: int) -> str:  # a Sequence of the passages' texts, read when asked for
        return self.passage(position)

    def text(self, passage_id: str) -> str:
        """The text of passage `passage_id` (KeyError if the corpus has none)."""
        position = self.position(passage_id)
        if position is None:
            raise KeyError(f"--corpus {self.name} has no passage with id {passage_id!r}")
        return self.passage(position)


def read_corpus(files: Sequence[Path], format_name: str, name: str) -> PassageCorpus:
    """Index the (id, text) rows of `files` (of the format named `format_name`) in one pass (`DataError` as
    `build_row_index` raises it; a streamed corpus is refused: a passage is read by offset when a batch needs it,
    and a compressed file has no offsets)."""
    text_format = format_named(format_name)
    if isinstance(text_format, StreamedFormat):
        raise DataError(f"--corpus {name}: a {text_format.name} corpus cannot be read by offset, as a corpus is (each "
                        f"passage looked up by id when a batch needs it); decompress it "
                        f"({text_format.decompress_command}) and give the .jsonl")
    hashes = array("q")  # 8 bytes a passage while indexing too
    rows = build_row_index(files, format_name, CORPUS_ID_KEY, CORPUS_TEXT_KEY, (), negatives_per_query=0,
                           on_kept=lambda record: hashes.append(id_hash(clean_text(record.get(CORPUS_ID_KEY)))),
                           option="--corpus")
    values = np.asarray(hashes, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    return PassageCorpus(rows, values[order], order.astype(np.int64), name)
