"""Do memory and the time to the first step stay flat as the image data grows? Per mode and format, a generated
data set of each size, and `gradcache train` on it for one step in a fresh process per point
(`benchmarks.first_step`): the peak anonymous memory of the process tree (RssAnon of the run and its `--workers`
data-loader processes, sampled every 5 ms: the indexes and pixels a run holds, not the file cache) above the
process's start and absolute, and the seconds from the process's start to the end of step 1.

    python -m benchmarks.image_data_scaling                                      # every part at 4,000 and 32,000
    python -m benchmarks.image_data_scaling --parts clip-shards --sizes 4000,32000 --workers 0

Parts: `simclr-folder` (an ImageFolder of JPEGs, 8 classes), `clip-table` (a caption CSV of the same files),
`simclr-shards` and `clip-shards` (webdataset tars of `--shard-size` samples), all at `--image-size`
(`benchmarks.image_data`, written once per size into `--data-dir`). Small models (a convnet of width 8, a
1-layer text transformer), so the data dominates. The run folders go to `--data-dir` and are removed after
each point. Time depends on the machine's load: report figures of an idle machine only. Writes
image_data_scaling.csv (one row per part and size) to the output folder.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import first_step, image_data
from benchmarks.flags import DATA_DIR, HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.report import write_csv

PARTS = ("simclr-folder", "clip-table", "simclr-shards", "clip-shards")
MODEL = {
    "simclr": ["--model", "convnet", "--width", "8", "--hidden-dim", "32", "--projection-dim", "16",
               "--eval-reference-size", "512"],
    "clip": ["--model", "convnet", "--width", "8", "--projection-dim", "16", "--text-width", "16",
             "--text-layers", "1", "--text-heads", "2"],
}
COLUMNS = ["part", "size", "image_size", "workers", "first_step_s", "peak_rss_anon_mb", "peak_rss_anon_abs_mb"]


def part_data(part: str, data_dir: Path, size: int, image_size: int, shard_size: int) -> Path:
    """The generated data set `part` trains on: an ImageFolder root, a caption table or a folder of shards."""
    if part == "simclr-folder":
        return image_data.image_folder(data_dir, size, image_size)
    if part == "clip-table":
        return image_data.caption_table(data_dir, size, image_size)
    return image_data.shards(data_dir, size, image_size, shard_size)


def one_step_argv(part: str, data: Path, run_folder: Path, args: argparse.Namespace, batch_size: int = 64,
                  steps: int = 1) -> list[str]:
    """`gradcache train <mode>` on `data` for `steps` steps with the small models and `args`' image size,
    held-out size, workers and threads."""
    mode = part.split("-")[0]
    return ["train", mode, "--data", str(Path(data).resolve()), "--output-dir", str(Path(run_folder).resolve()),
            "--image-size", str(args.image_size), "--batch-size", str(batch_size),
            "--chunk-size", str(batch_size // 2), "--steps", str(steps), "--warmup", "1",
            "--test-size", str(args.test_size), "--workers", str(args.workers), "--threads", str(args.threads),
            "--device", args.device, "--checkpoint-every", "1000", "--quiet", *MODEL[mode]]


def add_data_options(parser: argparse.ArgumentParser, workers: int | None = 2) -> None:
    """`--data-dir --image-size --shard-size --test-size` and, unless `workers` is None, `--workers`: shared with
    the data-wait and torchrun benchmarks (the same generated data sets)."""
    parser.add_argument("--data-dir", default=DATA_DIR,
                        help="where the generated data sets are written (and reused) and the runs go")
    parser.add_argument("--image-size", type=int, default=64, help="side of the generated images")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per webdataset shard")
    parser.add_argument("--test-size", type=int, default=256, help="held-out images (--test-size of the runs)")
    if workers is not None:
        parser.add_argument("--workers", type=int, default=workers, help="data-loader worker processes of the runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--sizes", default="4000,32000", help="comma-separated data set sizes (images)")
    add_data_options(parser)
    parser.add_argument("--time-budget-s", type=float, default=900.0, help="a point longer than this fails")
    add_shared_options(parser, "image_data_scaling", threads_help="--threads of the runs")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts {args.parts!r}: unknown {unknown}; choose from {', '.join(PARTS)}")
    folder = output_folder(args)
    data_dir = Path(args.data_dir)
    rows = []
    for part in parts:
        for size in integer_list(args.sizes, "--sizes"):
            data = part_data(part, data_dir, size, args.image_size, args.shard_size)
            run_folder = data_dir / "runs" / f"{part}-{size}"
            shutil.rmtree(run_folder, ignore_errors=True)
            [result] = first_step.run(one_step_argv(part, data, run_folder, args), timeout_s=args.time_budget_s)
            shutil.rmtree(run_folder, ignore_errors=True)
            rows.append({"part": part, "size": size, "image_size": args.image_size, "workers": args.workers,
                         **{key: result[key] for key in COLUMNS[4:]}})
            print(json.dumps(rows[-1]), flush=True)
    write_csv(folder / f"{args.name}.csv", rows, COLUMNS)
    print(f"wrote {folder / (args.name + '.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
