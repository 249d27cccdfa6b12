"""The options of the modes that train on rows of queries and passages (`gradcache train text` and `vlm`, RunConfig's
`ROWS` fields), declared once here for both: the rows' keys, `--eval-data`, `--negatives-per-query`, the prompts,
`--max-length` and GradCache's chunking by memory and by tokens; and the check of the prompts. Each mode adds its
own (`--model`, `--pooling`, its data)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError
from gradcache.train.modes.memory_size import memory_bytes


def add_row_key_options(data: argparse._ArgumentGroup, default: Callable[[str], Any]) -> None:
    """`--query-key`, `--positive-key`, `--negative-keys`: where each row keeps its texts."""
    data.add_argument("--query-key", default=default("query_key"), help="column (field) of the queries")
    data.add_argument("--positive-key", default=default("positive_key"),
                      help="column (field) of each query's positive passage")
    data.add_argument("--negative-keys", nargs="*", default=default("negative_keys"),
                      help="columns of hard negatives, or one JSONL field holding a list (default: none)")


def add_eval_data_option(data: argparse._ArgumentGroup, default: Callable[[str], Any]) -> None:
    """`--eval-data`: held-out rows apart from `--data`."""
    data.add_argument("--eval-data", default=default("eval_data"), help="held-out rows given apart from --data, "
                      "in its formats (a file, folder or pattern); the evaluation scores them (default: --test-size "
                      "rows of --data, held out by a seeded permutation)")


def add_negatives_option(data: argparse._ArgumentGroup, default: Callable[[str], Any], built_in: str) -> None:
    """`--negatives-per-query`: h; `built_in` says what the mode's built-in data has."""
    data.add_argument("--negatives-per-query", type=int, default=default("negatives_per_query"),
                      help="hard negatives h per query: a --data file's rows with fewer are skipped (default: "
                      f"the count most rows have); {built_in}")


def add_max_length_option(model: argparse._ArgumentGroup, default: Callable[[str], Any], what: str) -> None:
    """`--max-length`, the most tokens of one `what` ("text"; "input, its image tokens included")."""
    model.add_argument("--max-length", type=int, default=default("max_length"), help=f"most tokens per {what}")


def add_prompt_options(model: argparse._ArgumentGroup, default: Callable[[str], Any]) -> None:
    """`--query-prompt`, `--passage-prompt`: instructions before every query and passage (decoder embedders)."""
    model.add_argument("--query-prompt", default=default("query_prompt"), metavar="TEXT",
                       help="text prepended to every query in training, evaluation and the exported model's "
                       "prompts['query'], e.g. 'Instruct: retrieve the passage that answers it. Query: ' "
                       "(default: none)")
    model.add_argument("--passage-prompt", default=default("passage_prompt"), metavar="TEXT",
                       help="text prepended to every passage (positives and hard negatives), and the exported "
                       "model's prompts['document'] (default: none)")


def add_chunking_options(run: argparse._ArgumentGroup, default: Callable[[str], Any], tokens: str) -> None:
    """`--memory-budget` and `--chunk-tokens` (GradCache's options of those names); `tokens` says what a chunk's
    tokens count ("rows x the chunk's padded length")."""
    run.add_argument("--memory-budget", type=memory_bytes, default=default("memory_budget"),
                     help="gradcache: bytes of autograd graphs to keep from the first pass (e.g. 2G, 500M): the "
                     "chunks that fit are not re-encoded, trading memory for time (default: keep none)")
    run.add_argument("--chunk-tokens", type=int, default=default("chunk_tokens"),
                     help=f"gradcache: chunks of at most this many tokens ({tokens}) over the inputs sorted by "
                     "length, --chunk-size still capping the rows (default: fixed chunks of --chunk-size rows)")


def check_prompts(config: RunConfig) -> None:
    """A prompt given is text (UsageError naming the option otherwise)."""
    for option, prompt in (("--query-prompt", config.query_prompt), ("--passage-prompt", config.passage_prompt)):
        if prompt is not None and not prompt.strip():
            raise UsageError(f"{option} {prompt!r} is empty; give the text to prepend, or omit {option}")
