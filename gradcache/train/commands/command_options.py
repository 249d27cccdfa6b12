"""The options of `gradcache encode`, `gradcache eval` and `gradcache mine` (gradcache/train/cli.py registers them).

The options they share are spelled once here, with `gradcache train text`'s names and defaults where they mean
the same thing (`--query-key`, `--positive-key`, `--negative-keys`, `--max-length`, `--pooling`).
"""
from __future__ import annotations

import argparse

from gradcache.models.huggingface import HF_POOLINGS
from gradcache.train.commands.encode import TOWERS
from gradcache.train.commands.command_inputs import CORPUS_ID, CORPUS_TEXT
from gradcache.train.commands.mine import NEGATIVES_FIELD
from gradcache.train.commands.model import MODEL_HELP
from gradcache.train.data.text.formats import TEXT_LINES, described, listed, table_suffixes


def add_model_options(parser: argparse.ArgumentParser, model_help: str = MODEL_HELP) -> None:
    parser.add_argument("model", metavar="MODEL", help=model_help)
    parser.add_argument("--device", default="cpu", help="where to run the model (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=256, help="texts or images embedded at once (default: 256)")
    parser.add_argument("--max-length", type=int, default=None, help="most tokens per text (default: the run's "
                        "--max-length, else the folder's sentence-transformers max_seq_length, else 128)")
    parser.add_argument("--pooling", choices=list(HF_POOLINGS), default=None,
                        help="a model folder's pooling (default: the folder's own sentence-transformers pooling, "
                        "else mean); a run pools as it was trained")
    add_prompt_options(parser)


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--query-prompt", default=None, metavar="TEXT", help="a text model folder's prompt, prepended "
                        "to queries (encode: with --tower query) (default: the folder's "
                        "config_sentence_transformers.json prompts['query'], else none); a run prompts as it was "
                        "trained (its --query-prompt)")
    parser.add_argument("--passage-prompt", default=None, metavar="TEXT", help="a text model folder's prompt, "
                        "prepended to passages (encode: with --tower passage) (default: the folder's prompts"
                        "['document'], else none); a run prompts as it was trained (its --passage-prompt)")


def add_pairs_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--query-key", default="query", help="column (field) of the queries (default: query)")
    parser.add_argument("--positive-key", default="positive",
                        help="column (field) of each query's positive passage (default: positive)")
    parser.add_argument("--negative-keys", nargs="*", default=[], help="columns of hard negatives, or one JSONL "
                        "field holding a list; they join the corpus (default: none)")
    parser.add_argument("--corpus", default=None, help=f"a {listed(table_suffixes())} file of '{CORPUS_ID}' and "
                        f"'{CORPUS_TEXT}' rows to rank instead of the file's own passages; a row's positive is "
                        "found in it by its text, else by its id")


def add_encode_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--data", required=True, help=f"texts: a {TEXT_LINES} file (one text per line) or a "
                        f"{listed(table_suffixes())} table with --key; images: a folder (every image under it, sorted by path), a "
                        "table of image paths with --image-key, or webdataset shards (a .tar, a folder of them, a "
                        "glob or brace pattern: rows in shard order then member order; a member that does not "
                        "decode is skipped and counted on stderr)")
    parser.add_argument("--output", required=True, help="FILE.npy (an (N, D) float32 array, row i = input row i) "
                        "or FILE.faiss (an exact inner-product index whose ids are the row numbers); a SPLADE model "
                        "(--kind sparse): FILE.npz, its sparse rows in CSR form (indptr, indices, data, shape)")
    parser.add_argument("--key", default=None, help="the table column (JSONL field) of the texts")
    parser.add_argument("--image-key", default=None, help="the table column of image paths (relative to the "
                        "table's folder)")
    parser.add_argument("--pair-keys", nargs=2, default=None, metavar=("QUERY", "PASSAGE"),
                        help="a cross-encoder MODEL (--kind cross-encoder): the two table columns of each (query, "
                        "passage) row to score; --output FILE.npy then holds one score per row, CrossEncoder.predict's "
                        "(default: query passage)")
    parser.add_argument("--tower", choices=TOWERS, default="passage", help="the side that embeds the texts, for a "
                        "model with a query and a passage tower, and whose prompt they take (default: passage; one "
                        "shared tower without prompts: the same)")


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, f"{MODEL_HELP}; a checkpoint file or a sharded checkpoint folder (last.dcp) also "
                      "works (a run folder: its newest good checkpoint, a damaged last.pt falling back to "
                      "previous.pt with a warning)")
    parser.add_argument("--data", default=None, help="a file to score MODEL on, in a format train reads: text: "
                        f"{described()}, of (query, positive, hard negatives) rows, every row scored; "
                        "a clip or simclr run: its --data kinds, scored on a held-out split of --test-size (default: "
                        "a run's own held-out split)")
    add_pairs_options(parser)
    parser.add_argument("--test-size", type=int, default=None,
                        help="images held out of an image --data (default: the run's --test-size)")
    parser.add_argument("--classes", default=None, help="a CLIP model's zero-shot top-1 (zero_shot_top1, %%) of the "
                        "ImageFolder --data (labels: class folder names) against this file's classes: one a line, "
                        "'name' or 'name<TAB>template with {}' (more templates: more tabs; default template: "
                        "'a photo of a {}.')")
    parser.add_argument("--output", "--output-json", dest="output", default=None,
                        help="also write the metrics to this JSON file, one flat object (default: stdout only)")


def add_mine_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--data", required=True, help=f"{described()}, of (query, positive) rows")
    parser.add_argument("--output", required=True, help=f".jsonl (a '{NEGATIVES_FIELD}' list per row: train with "
                        f"--negative-keys {NEGATIVES_FIELD}) or .tsv/.csv (columns negative_1 .. negative_K)")
    parser.add_argument("--negatives", type=int, required=True, help="hard negatives K to mine per row")
    parser.add_argument("--replace-negatives", action="store_true", help="write the mined negatives alone (default: "
                        "each row's own negatives, those of --negative-keys and its fields named like negatives, "
                        "kept first and the mined ones after them, de-duplicated)")
    add_pairs_options(parser)
    parser.add_argument("--margin", type=float, default=0.0, help="skip a candidate whose cosine score is above "
                        "the positive's minus this (absolute; default: 0, nothing scoring above the positive)")
    parser.add_argument("--relative-margin", type=float, default=None, help="also skip a candidate scoring above "
                        "(1 - this) x the positive's score, in [0, 1) (default: off)")
    parser.add_argument("--range", type=int, nargs=2, metavar=("START", "END"), default=None,
                        help="draw from the candidates ranked START to END (1-based, the positive left out) "
                        "(default: all)")
