"""`gradcache train text` on real pairs that no test uses: English words and their WordNet definitions.

The pairs come from Princeton WordNet 3.0's noun database as Debian's `wordnet-base` package installs it
(`apt-get install wordnet-base`: /usr/share/wordnet/data.noun; WordNet's license permits use and redistribution).
Each pair is (query: a noun, positive: its gloss, the definition and its example sentences), for nouns with one
meaning only, so that each query has one right passage, e.g.

    aardvark    nocturnal burrowing mammal of the grasslands of Africa that feeds on termites; ...

A seeded sample of `--pairs` of them is written as a TSV with `query` and `positive` columns, then the default
command runs on it, `gradcache train text --data FILE` (plus any options after `--`), and the held-out mrr@10
before and after fine-tuning are printed. No download: the file is read from disk.

    python -m benchmarks.real_pairs                              # 2000 pairs, the default run on them
    python -m benchmarks.real_pairs --pairs 3000 -- --threads 2
    python -m benchmarks.real_pairs --pairs-only --output-dir wordnet   # the TSV alone (for mined_negatives)
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.flags import HelpFormatter, add_output_options, output_folder
from gradcache.cli import main as gradcache_main

WORDNET = Path("/usr/share/wordnet")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--wordnet", default=str(WORDNET), help="folder holding WordNet's data.noun")
    parser.add_argument("--pairs", type=int, default=2000, help="pairs sampled into the TSV")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--pairs-only", action="store_true", help="write the pairs' TSV and stop (no training)")
    parser.add_argument("train_options", nargs="*", help="after --: more options of gradcache train text")
    add_output_options(parser, "real_pairs")
    return parser


def noun_definitions(data_noun: Path) -> list[tuple[str, str]]:
    """(noun, gloss) for every noun of data.noun that names one synset only, in the file's order.

    A data line is `offset lex_filenum ss_type w_cnt word lex_id [word lex_id ...] p_cnt ... | gloss`; w_cnt
    is hexadecimal; words have underscores for spaces and may carry an adjective marker such as `(a)`."""
    synsets = []
    with open(data_noun, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("  ") or " | " not in line:  # the license header
                continue
            fields, gloss = line.split(" | ", 1)
            parts = fields.split()
            words = [parts[4 + 2 * i].split("(")[0].replace("_", " ") for i in range(int(parts[3], 16))]
            synsets.append((words, gloss.strip()))
    meanings = Counter(word.lower() for words, _ in synsets for word in set(words))
    return [(words[0], gloss) for words, gloss in synsets
            if meanings[words[0].lower()] == 1 and len(gloss.split()) >= 4]


def write_pairs(path: Path, pairs: Sequence[tuple[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(["query", "positive"])
        writer.writerows(pairs)


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    data_noun = Path(args.wordnet) / "data.noun"
    if not data_noun.is_file():
        print(f"--wordnet {args.wordnet}: no data.noun there; install WordNet 3.0 (Debian: apt-get install "
              "wordnet-base) or give the folder holding it", file=sys.stderr)
        return 2
    every = noun_definitions(data_noun)
    if args.pairs > len(every):
        print(f"--pairs {args.pairs}: WordNet has {len(every)} single-meaning nouns; ask for at most that",
              file=sys.stderr)
        return 2
    pairs = random.Random(args.seed).sample(every, args.pairs)
    folder = output_folder(args)
    tsv = folder / "wordnet_nouns.tsv"
    write_pairs(tsv, pairs)
    print(f"wrote {len(pairs)} pairs of {len(every)} single-meaning WordNet nouns to {tsv}", flush=True)
    if args.pairs_only:
        return 0
    run = folder / "run"
    argv = ["train", "text", "--data", str(tsv), "--output-dir", str(run), *args.train_options]
    started = time.perf_counter()
    status = gradcache_main(argv)
    if status != 0:
        print(f"gradcache {' '.join(argv)} exited with status {status}", file=sys.stderr)
        return status
    metrics = json.loads((run / "metrics.json").read_text())
    print(f"gradcache {' '.join(argv)}: mrr@10 {metrics['mrr@10_initial']:.1f} -> {metrics['mrr@10']:.1f} "
          f"({metrics['mrr@10'] - metrics['mrr@10_initial']:+.1f} points), {metrics['steps']} steps, "
          f"{time.perf_counter() - started:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
