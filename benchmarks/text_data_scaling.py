"""Peak anonymous memory and time to the first batch against dataset size: `gradcache train text`'s data.

Each point runs in a fresh process (`fresh_process.run_point`): it loads `--data` as the text mode does (the row
index in one streamed pass, the seeded held-out split, the held-out rows read), then draws the first training
batch through the data loader (rows read on demand), and again as a resume would (the saved RUN/data_index.npz
reused). Reported per point: `first_batch_s` (the start of the loading to the first batch), `resume_s`
(the same with the saved index), and `peak_rss_anon_mb`, the largest RssAnon (anonymous memory: what the data
costs, not the page cache of the file) sampled every 5 ms above the value before loading.

    python -m benchmarks.text_data_scaling --rows 100000,1000000 --formats jsonl,tsv,parquet

The data is generated once per (rows, format) into the output folder: a query of 8 words, a positive of 40 and
one hard negative of 40 (about 0.5 KB a row). The image modes: benchmarks/image_data_scaling.py.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

from benchmarks.flags import (
    HelpFormatter,
    add_output_options,
    integer_list,
    output_folder,
)
from benchmarks.anon_memory import PeakAnon
from benchmarks.fresh_process import report, run_point

FORMATS = ("jsonl", "tsv", "csv", "parquet")




def write_rows(path: Path, rows: int, seed: int = 0) -> Path:
    """`rows` generated (query, positive, negative) rows in the format of `path`'s extension."""
    generator = random.Random(seed)
    words = ["".join(generator.choices("abcdefghijklmnopqrstuvwxyz", k=generator.randint(3, 9))) for _ in range(5000)]

    def text(count: int) -> str:
        return " ".join(generator.choices(words, k=count))

    records = ({"query": text(8), "positive": text(40), "negative": text(40)} for _ in range(rows))
    if path.suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
    elif path.suffix in (".tsv", ".csv"):
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, ["query", "positive", "negative"],
                                    delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(records)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer = None
        batch: list[dict] = []
        for record in records:
            batch.append(record)
            if len(batch) == 10_000:
                table = pa.Table.from_pylist(batch)
                writer = writer or pq.ParquetWriter(path, table.schema)
                writer.write_table(table, row_group_size=4_096)
                batch = []
        if batch:
            table = pa.Table.from_pylist(batch)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=4_096)
        writer.close()
    return path


def first_batch_seconds(data: Path, run_folder: Path) -> float:
    """Seconds to load `data` as the text mode does and draw its first training batch (64 rows)."""
    from gradcache.train.config import RunConfig
    from gradcache.train.data.order import StepSampler, step_loader
    from gradcache.train.data.text.batches import QueryPassages
    from gradcache.train.modes.text import DATA_INDEX, Text, _save_index

    start = time.perf_counter()
    config = RunConfig(mode="text", data=str(data), negative_keys=["negative"], test_size=300,
                       output_dir=str(run_folder))
    splits = Text().load_data(config)
    sampler = StepSampler(len(splits.train), 64, seed=0, start_step=0, total_steps=1)
    next(iter(step_loader(QueryPassages(splits.train), sampler, list, 0)))
    seconds = time.perf_counter() - start
    if not (run_folder / DATA_INDEX).exists():
        _save_index(splits.train.index, config)
    return seconds


def point(spec: dict) -> None:
    """One point, in this (fresh) process: a first load, then a load as a resume would."""
    import warnings

    import gradcache.train.modes.text  # noqa: F401 (imported before the baseline: what is measured is the data)

    warnings.simplefilter("ignore")
    run_folder = Path(spec["run_folder"])
    run_folder.mkdir(parents=True, exist_ok=True)
    peak = PeakAnon()
    first = first_batch_seconds(Path(spec["data"]), run_folder)
    anon = peak.stop()
    resumed = first_batch_seconds(Path(spec["data"]), run_folder)
    report({"status": "ok", "first_batch_s": round(first, 2), "resume_s": round(resumed, 2),
            "peak_rss_anon_mb": round(anon / 2**20, 1)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--rows", default="100000,1000000", help="dataset sizes, comma-separated")
    parser.add_argument("--formats", default="jsonl,parquet", help=f"of {', '.join(FORMATS)}, comma-separated")
    parser.add_argument("--time-budget-s", type=float, default=900.0, help="a point longer than this is stopped")
    parser.add_argument("--point", default=None, help=argparse.SUPPRESS)
    add_output_options(parser, "text_data_scaling")
    args = parser.parse_args(argv)
    if args.point is not None:
        point(json.loads(args.point))
        return 0
    formats = [name.strip() for name in args.formats.split(",") if name.strip()]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"--formats {args.formats!r}: unknown {unknown}; choose from {', '.join(FORMATS)}")
    folder = output_folder(args)
    results = []
    for rows in integer_list(args.rows, "--rows"):
        for name in formats:
            data = folder / f"rows-{rows}.{name}"
            if not data.exists():
                write_rows(data, rows)
            spec = {"data": str(data.resolve()), "run_folder": str((folder / f"run-{rows}-{name}").resolve())}
            result = {"mode": "text", "format": name, "rows": rows, "file_mb": round(data.stat().st_size / 2**20, 1),
                      **run_point("benchmarks.text_data_scaling", spec, args.time_budget_s)}
            print(json.dumps(result), flush=True)
            results.append(result)
    with open(folder / f"{args.name}.csv", "w", newline="") as handle:
        columns = sorted({key for result in results for key in result})
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(results)
    print(f"wrote {folder / (args.name + '.csv')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
