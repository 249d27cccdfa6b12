"""Does a rank of a `torchrun` group hold more than a one-process run? The same one-step `gradcache train` on the
same generated data, in one process and under `torchrun --standalone --nproc-per-node N` (gloo on CPU): each
rank's peak anonymous memory (RssAnon of its process tree, the rank and its `--workers` loader processes, sampled
every 5 ms until the end of step 1; `benchmarks.first_step`), beside the one-process run's.

    python -m benchmarks.torchrun_memory                     # text on 100k JSONL rows, clip on 32k shard samples
    python -m benchmarks.torchrun_memory --parts clip --ranks 1,2,4

Parts: `text` (a JSONL file of `--text-rows` generated rows, text_data_scaling's; the packaged all-MiniLM-L6-v2 at
32 tokens) and `clip` (webdataset shards of `--clip-size` samples at `--image-size`, image_data_scaling's small
models). `--batch-scope global` (default) keeps the global `--batch-size` of the one-process run, as a user
moving to torchrun does (each rank then encodes 1/N of it, but its loss still sees the whole batch's
embeddings); `per-rank` gives every rank the one-process batch (the global batch grows N times, and with it
the loss's logits), so the encoders' activations are alike. The torchrun agent is not counted.
The data and runs go to `--data-dir`; writes torchrun_memory.csv (one row per rank of each run, `over_one_mb`:
the rank's absolute peak less the one-process run's) to the output folder.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import first_step, image_data
from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.image_data_scaling import add_data_options, one_step_argv
from benchmarks.report import write_csv
from benchmarks.text_data_scaling import program_argv, rows_file

PARTS = ("text", "clip")
BATCH = {"text": 16, "clip": 64}  # the one-process run's batch
COLUMNS = ["part", "ranks", "rank", "batch_size", "workers", "first_step_s", "peak_rss_anon_mb",
           "peak_rss_anon_abs_mb", "over_one_mb"]


def global_batch(part: str, ranks: int, scope: str) -> int:
    """The `--batch-size` of `part` on `ranks` ranks: the one-process batch, or (`per-rank`) that times `ranks`."""
    return BATCH[part] * (ranks if scope == "per-rank" else 1)


def part_argv(part: str, ranks: int, run_folder: Path, args: argparse.Namespace) -> list[str]:
    """The one-step command of `part` on `ranks` ranks (`global_batch`)."""
    batch = global_batch(part, ranks, args.batch_scope)
    if part == "text":
        data = rows_file(Path(args.data_dir), args.text_rows, "jsonl")
        return program_argv(data, run_folder, args.threads, batch_size=batch, workers=args.workers)
    data = image_data.shards(Path(args.data_dir), args.clip_size, args.image_size, args.shard_size)
    return one_step_argv("clip-shards", data, run_folder, args, batch_size=batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts (1: a plain process, no torchrun)")
    parser.add_argument("--text-rows", type=int, default=100_000, help="rows of the text part's JSONL file")
    parser.add_argument("--clip-size", type=int, default=32_000, help="samples of the clip part's shards")
    parser.add_argument("--batch-scope", choices=("global", "per-rank"), default="global",
                        help="keep the global batch of the one-process run, or its per-rank batch")
    parser.add_argument("--time-budget-s", type=float, default=900.0, help="a run longer than this fails")
    add_data_options(parser)
    add_shared_options(parser, "torchrun_memory", threads=1, threads_help="--threads of each rank")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if sorted(set(parts) - set(PARTS)):
        parser.error(f"--parts {args.parts!r}: unknown {sorted(set(parts) - set(PARTS))}; choose from "
                     f"{', '.join(PARTS)}")
    rank_counts = sorted(integer_list(args.ranks, "--ranks"))  # the one-process run first: the others compare with it
    folder = output_folder(args)
    rows = []
    for part in parts:
        one_process = None
        for ranks in rank_counts:
            run_folder = Path(args.data_dir) / "runs" / f"torchrun_memory-{part}-{ranks}"
            shutil.rmtree(run_folder, ignore_errors=True)
            command = part_argv(part, ranks, run_folder, args)
            results = first_step.run(command, ranks=ranks, timeout_s=args.time_budget_s)
            shutil.rmtree(run_folder, ignore_errors=True)
            if ranks == 1:
                one_process = results[0]["peak_rss_anon_abs_mb"]
            for result in results:
                over = None if one_process is None else round(result["peak_rss_anon_abs_mb"] - one_process, 1)
                rows.append({"part": part, "ranks": ranks, "rank": result["rank"],
                             "batch_size": global_batch(part, ranks, args.batch_scope), "workers": args.workers,
                             **{key: result[key] for key in COLUMNS[5:8]}, "over_one_mb": over})
                print(json.dumps(rows[-1]), flush=True)
    write_csv(folder / f"{args.name}.csv", rows, COLUMNS)
    print(f"wrote {folder / (args.name + '.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
