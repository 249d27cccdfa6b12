"""Mined hard negatives against in-batch negatives alone, at equal steps, through the program's own commands.

On the built-in `world-hard` (generated: passages that share words with queries they do not answer), the
training rows are written as a (query, positive) TSV and the held-out rows, with world-hard's generated hard
negative, as another. Then, all through `gradcache.cli.main`:

1. `gradcache mine all-MiniLM-L6-v2 --data train.tsv --negatives 1 --output mined.tsv` (+ `--mine-options`);
2. `gradcache train text --data mined.tsv` twice, with the same rows, seed, batch and steps: without
   `--negative-keys` (in-batch negatives alone) and with `--negative-keys negative_1` (each query's mined
   negative too);
3. `gradcache eval` of the pretrained model and of both runs on the held-out file (its corpus: every held-out
   positive and generated hard negative), so every arm is scored on the same corpus.

    python -m benchmarks.mined_negatives                       # 160 training rows, 20 steps of batch 8
    python -m benchmarks.mined_negatives --write-results -- --threads 2

`--data FILE` runs the same on real pairs instead: a `.tsv`, `.csv` or `.jsonl` of `query` and `positive` rows
(e.g. the WordNet nouns and definitions `python -m benchmarks.real_pairs --pairs-only` writes), of which a
sample seeded by `--data-seed` gives the `--train-size` training and `--test-size` held-out rows (distinct rows;
the file's other rows are not used). Such a file has no generated hard negative, so the held-out corpus is the
held-out positives alone.

    python -m benchmarks.real_pairs --pairs-only --output-dir wordnet
    python -m benchmarks.mined_negatives --data wordnet/wordnet_nouns.tsv --name mined_negatives_wordnet
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.flags import HelpFormatter, add_output_options, output_folder
from benchmarks.report import machine_context, write_csv
from gradcache.cli import main as gradcache_main
from gradcache.train.data.text.built_in import generate_world
from gradcache.train.data.text.formats import table_records
from gradcache.train.data.text.text_pairs import split_pairs

WORLD_HARD = "world-hard"
COLUMNS = ["data", "data_seed", "arm", "negatives_per_query", "steps", "mrr@10", "recall@1", "recall@10", "ndcg@10",
           "seconds",
           "loadavg_1m", "loadavg_5m", "threads", "torch_version"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--data", default=WORLD_HARD, help=f"'{WORLD_HARD}' (generated) or a .tsv, .csv or .jsonl "
                        "file of 'query' and 'positive' rows (real pairs; the module docstring says how they are "
                        "split)")
    parser.add_argument("--train-size", type=int, default=160, help="training rows")
    parser.add_argument("--test-size", type=int, default=100, help="held-out rows")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the generated world (or the file's "
                        "sample) and its split")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each run")
    parser.add_argument("--batch-size", type=int, default=8, help="queries per step")
    parser.add_argument("--mine-options", default="", help="more options of gradcache mine, one string "
                        "(e.g. '--margin 0.05 --range 2 50')")
    parser.add_argument("train_options", nargs="*", help="after --: more options of gradcache train text")
    add_output_options(parser, "mined_negatives")
    return parser


def _write_rows(path: Path, columns: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(columns)
        writer.writerows(rows)


def _command(argv: list[str]) -> None:
    print("$ gradcache " + " ".join(argv), file=sys.stderr)
    status = gradcache_main(argv)
    if status != 0:
        raise SystemExit(f"gradcache {argv[0]} exited {status}")


def _evaluate(model: str, test: Path, folder: Path, name: str, negatives: list[str]) -> dict[str, float]:
    output = folder / f"eval_{name}.json"
    _command(["eval", model, "--data", str(test), *negatives, "--output", str(output)])
    return json.loads(output.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    folder = output_folder(args)
    with tempfile.TemporaryDirectory(prefix=f"{args.name}-") as temporary:  # the runs' checkpoints: not kept
        rows = _arms(args, Path(temporary))
    write_csv(folder / f"{args.name}.csv", rows, COLUMNS)
    for row in rows:
        print(f"{row['arm']:>10}  mrr@10 {row['mrr@10']:5.1f}  recall@1 {row['recall@1']:5.1f}  "
              f"recall@10 {row['recall@10']:5.1f}  ({row['seconds']} s, load {row['loadavg_1m']:.1f})")
    print(f"wrote {folder / (args.name + '.csv')}", file=sys.stderr)
    return 0


def _file_pairs(args: argparse.Namespace) -> tuple[list[list[str]], list[list[str]]]:
    """(training, held-out) [query, positive] rows: a sample of `--data`'s distinct rows seeded by --data-seed."""
    records, names = table_records(Path(args.data), "--data")
    if not {"query", "positive"} <= names:
        raise SystemExit(f"--data {args.data}: needs 'query' and 'positive' columns, has {sorted(names)}")
    rows = list(dict.fromkeys((str(record["query"]).strip(), str(record["positive"]).strip())
                              for _, record in records if record.get("query") and record.get("positive")))
    wanted = args.train_size + args.test_size
    if len(rows) < wanted:
        raise SystemExit(f"--data {args.data}: {len(rows)} distinct rows, fewer than --train-size + --test-size "
                         f"{wanted}; ask for fewer")
    sample = [list(row) for row in random.Random(args.data_seed).sample(rows, wanted)]
    return sample[args.test_size:], sample[:args.test_size]


def _arms(args: argparse.Namespace, work: Path) -> list[dict]:
    """Mine, train both arms and evaluate the pretrained model and both runs (module docstring); one row each."""
    train, test, mined = work / "train.tsv", work / "test.tsv", work / "mined.tsv"
    if args.data == WORLD_HARD:
        pairs = generate_world(args.train_size + args.test_size, 1, args.data_seed, hard=True)
        splits = split_pairs(pairs, args.test_size, args.data_seed, name="world-hard")
        _write_rows(train, ["query", "positive"], [[q, p] for q, p in zip(splits.train.queries,
                                                                           splits.train.positives)])
        _write_rows(test, ["query", "positive", "hard"], [[q, p, n[0]] for q, p, n in
                                                           zip(splits.test.queries, splits.test.positives,
                                                               splits.test.negatives)])
        held_out_negatives = ["--negative-keys", "hard"]
    else:
        training, held_out = _file_pairs(args)
        _write_rows(train, ["query", "positive"], training)
        _write_rows(test, ["query", "positive"], held_out)
        held_out_negatives = []  # the corpus: the held-out positives
    started = time.perf_counter()
    _command(["mine", "all-MiniLM-L6-v2", "--data", str(train), "--negatives", "1", "--output", str(mined),
              *args.mine_options.split()])
    mining_seconds = time.perf_counter() - started
    common = ["--data", str(mined), "--test-size", "8", "--steps", str(args.steps), "--batch-size",
              str(args.batch_size), "--chunk-size", str(args.batch_size), "--max-length", "40", "--lr", "2e-4",
              "--eval-every", "0", "--quiet", *args.train_options]
    rows = []
    base = _evaluate("all-MiniLM-L6-v2", test, work, "pretrained", held_out_negatives)
    data = WORLD_HARD if args.data == WORLD_HARD else Path(args.data).name
    seed = args.data_seed
    rows.append({"data": data, "data_seed": seed, "arm": "pretrained", "negatives_per_query": "", "steps": 0, **base,
                 "seconds": round(mining_seconds, 1), **machine_context(0, "cpu")})
    for arm, extra, per_query in [("in-batch", [], 0), ("mined", ["--negative-keys", "negative_1"], 1)]:
        started = time.perf_counter()
        run = work / arm
        _command(["train", "text", *common, *extra, "--output-dir", str(run)])
        metrics = _evaluate(str(run), test, work, arm, held_out_negatives)
        rows.append({"data": data, "data_seed": seed, "arm": arm, "negatives_per_query": per_query, "steps": args.steps,
                     **metrics,
                     "seconds": round(time.perf_counter() - started, 1), **machine_context(0, "cpu")})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(main())
