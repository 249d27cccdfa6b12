"""Do memory and the time to the first step stay flat as the data grows? Per mode and format, a generated data set
of each size, and `gradcache train` on it for one step in a fresh process per point, reading that process's peak
anonymous memory (RssAnon sampled every 5 ms: the pixels and indexes a run holds, not the file cache) and the
seconds from the process's start to the end of step 1.

    python -m benchmarks.image_data_scaling                            # images: an ImageFolder of 4,000 and 32,000
    python -m benchmarks.image_data_scaling --parts images --sizes 500,4000

Parts: `images` (simclr on an ImageFolder of 32 x 32 PNGs in 8 classes, decoded when drawn; `--workers 0`, so
the decoding is in the measured process). Time depends on the machine's load: report figures of an idle machine
only. Writes image_data_scaling.csv (part, size, peak_rss_anon_mb, first_step_s) to the output folder.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.anon_memory import PeakAnon
from benchmarks.flags import HelpFormatter, add_shared_options, output_folder

RUN = ["--image-size", "32", "--batch-size", "64", "--chunk-size", "32", "--steps", "1", "--test-size", "256",
       "--eval-reference-size", "512", "--workers", "0", "--quiet", "--checkpoint-every", "1000"]


def generate_image_folder(folder: Path, size: int) -> Path:
    """`size` 32 x 32 PNGs in 8 class folders (written once; reused when the folder holds them already)."""
    import numpy as np
    from PIL import Image

    marker = folder / f".complete-{size}"
    if marker.exists():
        return folder
    generator = np.random.default_rng(0)
    for index in range(size):
        target = folder / f"class{index % 8}" / f"{index:06d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(generator.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(target)
    marker.touch()
    return folder




def measure_point(part: str, data: str, output: str, threads: int) -> dict[str, float]:
    """In this (fresh) process: one step of the part's run on `data`; peak RssAnon and seconds to step 1."""
    started = time.monotonic()
    peak = PeakAnon()
    from gradcache.cli import main as gradcache
    from gradcache.train.run_folder.log import RunLog

    first_step: list[float] = []
    log_step = RunLog.log_step

    def logged(self, row):
        log_step(self, row)
        if not first_step:
            first_step.append(time.monotonic() - started)

    RunLog.log_step = logged
    mode = {"images": "simclr"}[part]
    status = gradcache(["train", mode, "--data", data, "--output-dir", output, "--threads", str(threads), *RUN])
    peak_mb = peak.stop(absolute=True) / 2**20
    if status != 0 or not first_step:
        raise SystemExit(f"the {part} run on {data} failed with status {status}")
    return {"peak_rss_anon_mb": round(peak_mb, 1), "first_step_s": round(first_step[0], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--parts", default="images", help="comma-separated: images")
    parser.add_argument("--sizes", default="4000,32000", help="comma-separated data set sizes")
    parser.add_argument("--data-dir", default="runs/benchmarks/image_data_scaling_data",
                        help="where the generated data sets are written (and reused)")
    parser.add_argument("--point", nargs=3, metavar=("PART", "DATA", "OUTPUT"), help=argparse.SUPPRESS)
    add_shared_options(parser, "image_data_scaling")
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(measure_point(*args.point, threads=args.threads)))
        return 0
    folder = output_folder(args)
    rows = []
    for part in args.parts.split(","):
        for size in [int(s) for s in args.sizes.split(",")]:
            data = generate_image_folder(Path(args.data_dir) / f"{part}-{size}", size)
            result = subprocess.run([sys.executable, "-m", "benchmarks.image_data_scaling", "--threads", str(args.threads),
                                     "--point", part, str(data), str(folder / f"run-{part}-{size}")],
                                    capture_output=True, text=True, check=True)
            rows.append({"part": part, "size": size, **json.loads(result.stdout.strip().splitlines()[-1])})
            print(rows[-1], flush=True)
    with open(folder / "image_data_scaling.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
