"""`gradcache mine MODEL --data FILE --output FILE --negatives K`: hard negatives for each row, from a model.

For row i with query q_i and positive p_i, every corpus passage c other than the positive gets the score
s(q_i, c) = cos(E_query(q_i), E_passage(c)), and the kept negatives are

    ranked  = the corpus passages other than p_i (and other than any passage of the same text), by s descending
    window  = ranked[start - 1 : end]                                    (--range START END, 1-based ranks)
    kept    = [c in window if s(c) <= s(p_i) - margin                    (--margin, absolute)
                            and s(c) <= s(p_i) * (1 - relative_margin)]  (--relative-margin, optional)
    negatives_i = kept[:K]                                               (--negatives K)

the false-negative guards of sentence-transformers' `mine_hard_negatives` (`absolute_margin`,
`relative_margin`, `range_min`/`range_max`): a candidate scoring above the positive, or within the margin of it,
is more likely an unlabelled positive than a negative. A row may keep fewer than K (a small corpus, a strict
margin): it is written with what it has, and the count of such rows is reported; `gradcache train text` skips
and counts rows with fewer than h negatives.

A row keeps the negatives it already has, written first: those of the columns `--negative-keys` names, then
those of its fields named like negatives (`negatives`, `negative_1`, `hard_negatives` ...; usable_rows.py's
`NEGATIVE_COLUMN`), whether or not `--negative-keys` names them, each key's in order, a list's in its order; then
negatives_i, best first; a text met twice is kept at its first place. With `replace` (`--replace-negatives`) the
row's own negatives are dropped and negatives_i alone is written.

The corpus is every distinct passage of the file (positives, and the hard negatives of `--negative-keys`), or
`--corpus` id/text rows. The output, by extension: `.jsonl` rows `{QUERY_KEY: ..., POSITIVE_KEY: ...,
"negatives": [...]}` (train with `--negative-keys negatives`), or `.tsv`/`.csv` columns QUERY_KEY,
POSITIVE_KEY, negative_1 .. negative_K (train with `--negative-keys negative_1 ... negative_K`). The input's other
columns (ids, labels, scores) follow the positive, as the input held them, whatever the format of `--data`
(`.jsonl`, `.jsonl.gz`, `.tsv`, `.csv`, Parquet, a datasets folder): a table's cell that is not text is written
as JSON, and a value JSON cannot hold (a timestamp, bytes) as its text; a column of the mined negatives' name is
replaced.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from gradcache.train.commands.encode import embed_text_rows
from gradcache.train.commands.evaluate import pairs_corpus, read_pairs
from gradcache.train.commands.command_outputs import check_output, write_atomically
from gradcache.train.modes.loaded_model import LoadedModel
from gradcache.train.data.text.files import data_files
from gradcache.train.data.streams import Damaged
from gradcache.train.data.text.formats import IndexedFormat, TextFormat, file_format, format_named, table_suffixes
from gradcache.train.data.text.formats.jsonl import json_value
from gradcache.train.data.text.usable_rows import UnusedNegatives, record_negatives, row_fields, unused_negatives
from gradcache.train.errors import UsageError

OUTPUT_SUFFIXES = tuple(table_suffixes())  # .jsonl, .tsv, .csv
NEGATIVES_FIELD = "negatives"  # the JSONL field of the mined negatives
QUERY_BLOCK = 1024  # queries scored at once: a (1024, C) float32 block of scores


@dataclass(frozen=True)
class Guards:
    """The false-negative guards (module docstring).

    Args:
        margin: keep s(c) <= s(p) - margin (absolute; 0: nothing above the positive).
        relative_margin: keep s(c) <= s(p) (1 - relative_margin) as well; None: no relative guard.
        start, end: the 1-based ranks (inclusive) to draw from; end None: to the last passage.
    """

    margin: float = 0.0
    relative_margin: float | None = None
    start: int = 1
    end: int | None = None

    def check(self) -> None:
        """Raise UsageError for a value that cannot work."""
        if not np.isfinite(self.margin):
            raise UsageError(f"--margin must be a finite number, got {self.margin}")
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            raise UsageError(f"--relative-margin must be in [0, 1) (a share of the positive's score), got "
                             f"{self.relative_margin}")
        if self.start < 1 or (self.end is not None and self.end < self.start):
            raise UsageError(f"--range {self.start} {self.end}: give two ranks 1 <= START <= END")


def mine_negatives(queries: np.ndarray, corpus: np.ndarray, positives: np.ndarray, count: int, guards: Guards,
                   same_as_positive: list[np.ndarray] | None = None) -> list[list[int]]:
    """For each query, the corpus indices of at most `count` negatives (module docstring), best first.

    Args:
        queries: (N, D) L2-normalised query embeddings.
        corpus: (C, D) L2-normalised passage embeddings.
        positives: (N,) each query's positive's corpus index.
        count: K, negatives per query.
        guards: the margin and range.
        same_as_positive: per query, further corpus indices never to return (passages of the positive's text).
    """
    mined: list[list[int]] = []
    for first in range(0, len(queries), QUERY_BLOCK):
        scores = queries[first:first + QUERY_BLOCK] @ corpus.T  # (b, C)
        for row, row_scores in enumerate(scores):
            index = first + row
            positive_score = row_scores[positives[index]]
            ranked = np.argsort(-row_scores, kind="stable")  # (C,) best first; ties by corpus order
            excluded = {int(positives[index])}
            if same_as_positive is not None:
                excluded.update(same_as_positive[index].tolist())
            ranked = [int(c) for c in ranked if int(c) not in excluded]
            window = ranked[guards.start - 1:guards.end]
            kept = [c for c in window if row_scores[c] <= positive_score - guards.margin
                    and (guards.relative_margin is None
                         or row_scores[c] <= positive_score * (1 - guards.relative_margin))]
            mined.append(kept[:count])
    return mined


class Mined(NamedTuple):
    """What `mine` wrote: its rows, the rows whose mining found fewer than K, the most negatives of a row (a
    table's negative_1 .. negative_`width` columns), and the fields whose own negatives the rows kept."""

    rows: int
    short: int
    width: int
    kept_keys: tuple[str, ...]


def mine(model: LoadedModel, data: str, output: str, negatives: int, guards: Guards = Guards(),
         corpus: str | None = None, query_key: str = "query", positive_key: str = "positive",
         negative_keys: list[str] | None = None, batch_size: int = 256, replace: bool = False) -> Mined:
    """Mine `negatives` hard negatives per row of `data` with `model` and write them to `output`, beside the
    row's own negatives unless `replace` (module docstring).

    Raises:
        UsageError: an image model, a bad count, guard or output path.
        DataError: unusable data or corpus.
    """
    path = check_output(output, OUTPUT_SUFFIXES)
    if not model.mode.ranks_passages:
        raise UsageError(f"gradcache mine ranks passages for queries; MODEL ({model.source}) is a {model.noun} "
                         "model, give a text model")
    if not model.mode.mines:
        raise UsageError(f"gradcache mine ranks by dense embeddings; MODEL ({model.source}) is a {model.mode.kind} "
                         "text model: mine with a dense model (a --kind dense run, a sentence-transformers folder)")
    guards.check()
    with warnings.catch_warnings():  # columns named like negatives that no key names: kept below, not unused
        warnings.simplefilter("ignore", UnusedNegatives)
        pairs = read_pairs(data, query_key, positive_key, negative_keys or ())
    ranked, positives = pairs_corpus(pairs, corpus)
    by_text: dict[str, list[int]] = {}
    for index, text in enumerate(ranked.texts):
        by_text.setdefault(text, []).append(index)
    same_text = [np.array(by_text.get(ranked.texts[p], []), dtype=np.int64) for p in positives]
    with torch.inference_mode():
        query_embeddings = embed_text_rows(model, pairs.queries, "query", batch_size, "encode queries")
        corpus_embeddings = embed_text_rows(model, ranked.texts, "passage", batch_size, "encode corpus")
    mined = mine_negatives(query_embeddings, corpus_embeddings, positives, negatives, guards, same_text)
    keys = (query_key, positive_key, tuple(negative_keys or ()))
    others = _other_columns(data, keys, pairs.negatives_per_query, len(mined))
    names = {name for fields in others for name in fields}
    own_keys = (*keys[2], *unused_negatives(names, keys))
    rows = []
    for query, positive, found, fields in zip(pairs.queries, pairs.positives, mined, others):
        own = [] if replace else record_negatives(fields, own_keys)
        rows.append((query, positive, list(dict.fromkeys([*own, *(ranked.texts[c] for c in found)]))))
        for key in own_keys:  # written as the row's negatives (or replaced), not as a column of their own
            fields.pop(key, None)
    width = max([negatives, *(len(found) for _, _, found in rows)])
    write_atomically(path, lambda temporary: _write(rows, others, temporary, file_format(path), query_key,
                                                   positive_key, width))
    return Mined(len(rows), sum(len(found) < negatives for found in mined), width,
                 () if replace else tuple(key for key in own_keys if key in names))


def _other_columns(data: str, keys: tuple[str, str, tuple[str, ...]], h: int, count: int) -> list[dict]:
    """Each usable row's fields other than its query and positive, in order (the rows training keeps: the same
    rule, `row_fields(...).unusable`), every column of a columnar file read."""
    files, name = data_files(data)
    text_format = format_named(name)
    others = [{key: _json_safe(value) for key, value in record.items() if key not in keys[:2]}
              for record in _records(text_format, files, keys) if row_fields(record, keys).unusable(h) is None]
    if len(others) != count:  # one rule read the rows twice: they must agree
        raise RuntimeError(f"mine read {count} usable rows of {data}, then {len(others)}")
    return others


def _records(text_format: TextFormat, files: list[Path], keys: tuple[str, str, tuple[str, ...]]) -> Iterator[dict]:
    """Every record of `files`, every field; a streamed file's JSON objects up to its damage (as read_pairs
    reads them: a line that is not a JSON object is no row)."""
    for file in files:
        if not text_format.streamed:
            yield from (record for _, _, record in text_format.records(file, keys, every_column=True))
            continue
        for unit in text_format.lines(str(file)):
            if isinstance(unit, Damaged):
                break
            try:
                record = json_value(unit[2])
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def _json_safe(value: Any) -> Any:
    """`value`, or its text where JSON cannot hold it (a columnar file's timestamp, bytes or decimal)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _write(rows: list[tuple[str, str, list[str]]], others: list[dict], temporary: Path,
           text_format: IndexedFormat, query_key: str, positive_key: str, negatives: int) -> None:
    """The rows as the module docstring says: the negatives in one list field, or in `negatives` columns of a
    table, the input's other columns between the positive and them."""
    mined = [NEGATIVES_FIELD] if text_format.holds_lists else negative_columns(negatives)
    names = list(dict.fromkeys(key for fields in others for key in fields if key not in mined))
    extra = [[fields.get(key) for key in names] for fields in others]
    if not text_format.holds_lists:  # a table's cells are text
        extra = [["" if v is None else v if isinstance(v, str) else json.dumps(v) for v in values] for values in extra]
    columns = [query_key, positive_key, *names, *mined]
    if text_format.holds_lists:
        values = [[query, positive, *more, found] for (query, positive, found), more in zip(rows, extra)]
    else:
        values = [[query, positive, *more, *found, *[""] * (negatives - len(found))]
                  for (query, positive, found), more in zip(rows, extra)]
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        text_format.write(handle, columns, values)


def negative_keys_of(output: str, negatives: int) -> str:
    """The --negative-keys that train on the mined file `output`: its list field, or its K columns."""
    return NEGATIVES_FIELD if file_format(output).holds_lists else " ".join(negative_columns(negatives))


def negative_columns(count: int) -> list[str]:
    """The table columns of the mined negatives: negative_1 .. negative_K."""
    return [f"negative_{number}" for number in range(1, count + 1)]
