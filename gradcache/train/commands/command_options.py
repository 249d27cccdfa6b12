"""The options of `gradcache encode`, `gradcache eval` and `gradcache mine` (gradcache/train/cli.py registers them),
declared as `RunConfig` declares the run's: one dataclass field per option, its default, flag, help and valid range
in `command_option(...)` metadata, from which the parser is built (`add_options`) and the values checked once,
before MODEL is loaded (`check_options`).

A field the commands share with `gradcache train` (`like=` a RunConfig field: `--device`, `--max-length`,
`--pooling`, the prompts, `--query-key`, `--positive-key`, `--negative-keys`, `--test-size`) takes its name, default
where the meaning is the same, and range from that field; only what differs (its help, a default of "the run's own")
is written here.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from gradcache.models.huggingface import HF_POOLINGS
from gradcache.ranges import within
from gradcache.train.commands.command_inputs import CORPUS_ID, CORPUS_TEXT
from gradcache.train.commands.encode import TOWERS
from gradcache.train.commands.mine import NEGATIVES_FIELD
from gradcache.train.commands.model import MODEL_HELP
from gradcache.train.config import RunConfig
from gradcache.train.data.text.formats import TEXT_LINES, described, listed, table_suffixes
from gradcache.train.errors import UsageError

_FROM_RUN = object()  # `command_option(default=...)`: the default of the RunConfig field it is `like`


def command_option(default: Any = _FROM_RUN, *, help: str, like: str | None = None, flags: tuple[str, ...] = (),
                   at_least: float | None = None, positional: bool = False, **argparse_options: Any) -> Any:
    """A field of a command's options: its default (`like`'s RunConfig default unless given), `help`, the range
    `at_least` (`like`'s unless given), its flags (default: `--field-name`; `positional`: its name alone) and what
    else `argparse.add_argument` takes (`type`, `choices`, `nargs`, `metavar`, `required`)."""
    shared = RunConfig.__dataclass_fields__[like] if like is not None else None
    if default is _FROM_RUN:
        default = shared.default
    if at_least is None and shared is not None:
        at_least = shared.metadata["at_least"]
    why = shared.metadata["why"] if shared is not None and at_least == shared.metadata["at_least"] else ""
    metadata = dict(help=help, flags=flags, at_least=at_least, why=why, positional=positional,
                    argparse=argparse_options)
    if isinstance(default, list):  # a fresh list per value, as argparse gives one per parse
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass
class ModelOptions:
    """MODEL and how it runs: encode, eval and mine alike."""

    model: str = command_option(None, help=MODEL_HELP, positional=True, metavar="MODEL")
    device: str = command_option(like="device", help="where to run the model (default: cpu)")
    batch_size: int = command_option(256, at_least=1, type=int,
                                     help="texts or images embedded at once (default: 256)")
    max_length: int | None = command_option(None, like="max_length", type=int, help="most tokens per text (default: "
                                             "the run's --max-length, else the folder's sentence-transformers "
                                             "max_seq_length, else 128)")
    pooling: str | None = command_option(like="pooling", choices=list(HF_POOLINGS),
                                         help="a model folder's pooling (default: the folder's own "
                                         "sentence-transformers pooling, else mean); a run pools as it was trained")
    query_prompt: str | None = command_option(like="query_prompt", metavar="TEXT", help="a text model folder's "
                                              "prompt, prepended to queries (encode: with --tower query) (default: "
                                              "the folder's config_sentence_transformers.json prompts['query'], else "
                                              "none); a run prompts as it was trained (its --query-prompt)")
    passage_prompt: str | None = command_option(like="passage_prompt", metavar="TEXT", help="a text model folder's "
                                                "prompt, prepended to passages (encode: with --tower passage) "
                                                "(default: the folder's prompts['document'], else none); a run "
                                                "prompts as it was trained (its --passage-prompt)")


@dataclass
class PairsOptions:
    """The (query, positive, hard negatives) rows eval and mine read, as `gradcache train text` reads them."""

    query_key: str = command_option(like="query_key", help="column (field) of the queries (default: query)")
    positive_key: str = command_option(like="positive_key",
                                       help="column (field) of each query's positive passage (default: positive)")
    negative_keys: list[str] = command_option([], like="negative_keys", nargs="*", help="columns of hard negatives, "
                                              "or one JSONL field holding a list; they join the corpus (default: "
                                              "none)")
    corpus: str | None = command_option(None, help=f"a {listed(table_suffixes())} file of '{CORPUS_ID}' and "
                                        f"'{CORPUS_TEXT}' rows to rank instead of the file's own passages; a row's "
                                        "positive is found in it by its text, else by its id")


@dataclass
class EncodeOptions:
    data: str = command_option(None, required=True, help=f"texts: a {TEXT_LINES} file (one text per line) or a "
                               f"{listed(table_suffixes())} table with --key; images: a folder (every image under it, sorted by path), a "
                               "table of image paths with --image-key, or webdataset shards (a .tar, a folder of "
                               "them, a glob or brace pattern: rows in shard order then member order; a member that "
                               "does not decode is skipped and counted on stderr)")
    output: str = command_option(None, required=True, help="FILE.npy (an (N, D) float32 array, row i = input row i) "
                                 "or FILE.faiss (an exact inner-product index whose ids are the row numbers); a "
                                 "SPLADE model (--kind sparse): FILE.npz, its sparse rows in CSR form (indptr, "
                                 "indices, data, shape)")
    key: str | None = command_option(None, help="the table column (JSONL field) of the texts; a vision-language "
                                     "MODEL: with --image-key or alone, each row one input of its text and images")
    image_key: str | None = command_option(None, help="the table column of image paths (relative to the table's "
                                           "folder); a vision-language MODEL: a path, a list of paths or {bytes, "
                                           "path} per row, with --key or alone (other models: one of the two)")
    pair_keys: list[str] | None = command_option(None, nargs=2, metavar=("QUERY", "PASSAGE"), help="a cross-encoder "
                                                 "MODEL (--kind cross-encoder): the two table columns of each (query, "
                                                 "passage) row to score; --output FILE.npy then holds one score per "
                                                 "row, CrossEncoder.predict's (default: query passage)")
    tower: str = command_option("passage", choices=TOWERS, help="the side that embeds the texts, for a model with a "
                                "query and a passage tower, and whose prompt they take (default: passage; one shared "
                                "tower without prompts: the same)")


@dataclass
class EvalData:
    data: str | None = command_option(None, help="a file to score MODEL on, in a format train reads: text: "
                                      f"{described()}, of (query, positive, hard negatives) rows, every row scored; "
                                      "a clip or simclr run: its --data kinds, scored on a held-out split of "
                                      "--test-size (default: a run's own held-out split)")


@dataclass
class EvalOptions:
    test_size: int | None = command_option(None, like="test_size", type=int,
                                           help="images held out of an image --data (default: the run's --test-size)")
    classes: str | None = command_option(None, help="a CLIP model's zero-shot top-1 (zero_shot_top1, %%) of the "
                                         "ImageFolder --data (labels: class folder names) against this file's "
                                         "classes: one a line, 'name' or 'name<TAB>template with {}' (more templates: "
                                         "more tabs; default template: 'a photo of a {}.')")
    output: str | None = command_option(None, flags=("--output", "--output-json"), help="also write the metrics to "
                                        "this JSON file, one flat object (default: stdout only)")


@dataclass
class MineData:
    data: str = command_option(None, required=True, help=f"{described()}, of (query, positive) rows")
    output: str = command_option(None, required=True, help=f".jsonl (a '{NEGATIVES_FIELD}' list per row: train with "
                                 f"--negative-keys {NEGATIVES_FIELD}) or .tsv/.csv (columns negative_1 .. "
                                 "negative_K)")
    negatives: int = command_option(None, required=True, at_least=1, type=int,
                                    help="hard negatives K to mine per row")
    replace_negatives: bool = command_option(False, action="store_true", help="write the mined negatives alone "
                                             "(default: each row's own negatives, those of --negative-keys and its "
                                             "fields named like negatives, kept first and the mined ones after them, "
                                             "de-duplicated)")


@dataclass
class MineOptions:
    margin: float = command_option(0.0, type=float, help="skip a candidate whose cosine score is above the "
                                   "positive's minus this (absolute; default: 0, nothing scoring above the positive)")
    relative_margin: float | None = command_option(None, type=float, help="also skip a candidate scoring above (1 - "
                                                   "this) x the positive's score, in [0, 1) (default: off)")
    range: list[int] | None = command_option(None, type=int, nargs=2, metavar=("START", "END"), help="draw from the "
                                             "candidates ranked START to END (1-based, the positive left out) "
                                             "(default: all)")


ENCODE_OPTIONS = (ModelOptions, EncodeOptions)
EVAL_OPTIONS = (ModelOptions, EvalData, PairsOptions, EvalOptions)
MINE_OPTIONS = (ModelOptions, MineData, PairsOptions, MineOptions)


def _flags(field: dataclasses.Field) -> tuple[str, ...]:
    if field.metadata["positional"]:
        return (field.name,)
    return field.metadata["flags"] or ("--" + field.name.replace("_", "-"),)


def add_options(parser: argparse.ArgumentParser, groups: tuple[type, ...], **helps: str) -> None:
    """Every field of `groups`, in order, as `parser`'s arguments; `helps`: a field's help in this command, where it
    says more than the field's own."""
    for group in groups:
        for field in dataclasses.fields(group):
            options = dict(field.metadata["argparse"], help=helps.get(field.name, field.metadata["help"]))
            if not field.metadata["positional"]:
                default = field.default_factory() if field.default is dataclasses.MISSING else field.default
                options.update(default=default, dest=field.name)
            parser.add_argument(*_flags(field), **options)


def check_options(args: argparse.Namespace, groups: tuple[type, ...]) -> None:
    """Each given value of `groups`' fields within its range (UsageError naming the flag, the bound and the value),
    before MODEL is loaded."""
    for group in groups:
        for field in dataclasses.fields(group):
            value, at_least = getattr(args, field.name), field.metadata["at_least"]
            if value is None or at_least is None:
                continue
            if isinstance(value, bool) or not within(value, at_least=at_least):  # NaN too
                why = f" ({field.metadata['why']})" if field.metadata["why"] else ""
                raise UsageError(f"{_flags(field)[0]} must be at least {at_least:g}{why}, got {value}")


def add_encode_options(parser: argparse.ArgumentParser) -> None:
    add_options(parser, ENCODE_OPTIONS)


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    add_options(parser, EVAL_OPTIONS, model=f"{MODEL_HELP}; a checkpoint file or a sharded checkpoint folder "
                "(last.dcp) also works (a run folder: its newest good checkpoint, a damaged last.pt falling back to "
                "previous.pt with a warning)")


def add_mine_options(parser: argparse.ArgumentParser) -> None:
    add_options(parser, MINE_OPTIONS)
