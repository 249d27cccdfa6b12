"""Peak memory per rank and step time against world size, for DDP and FSDP2, with and without GradCache.

A deliberately wide MLP encoder (parameters, gradients and AdamW state dominate) trained SimCLR-style (NTXent on
two views) with a fixed global batch split over 1, 2 and 4 gloo ranks on CPU. Per configuration and world size,
ranks are forked afresh so peak RSS (VmHWM, reset through /proc/self/clear_refs) counts only that run, above the
RSS before the model was built; glibc is told to return large blocks (mallopt) so freed tensors leave RSS. Step
time is the median of `--repeats` steps after one warm-up step (which allocates AdamW's state), optimizer step
included. FSDP2's all-gathers and reduce-scatters are counted during one step (DDP's all-reduce runs in C++,
unseen here: it is one bucketed all-reduce per step, see tests/test_distributed.py).

    python -m benchmarks.sharding                      # width 1536, depth 4, batch 512, chunk 64; 1, 2, 4 ranks
    python -m benchmarks.sharding --world-sizes 1 2 --repeats 2

One torch thread per rank by default: on a shared machine multi-threaded matrix products slowed down most
(a 1-rank full-batch step took 4.8 s with 2 threads, 2.1 s with 1). Ranks share the machine's cores, so on a
2-core machine 4 ranks time contention, not scaling. Results: benchmarks/results/sharding.{csv,png}.
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  FSDP2 imports it lazily: once here, inherited by the forked ranks
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from gradcache import FullBatch, GradCache
from gradcache.losses import NTXent

from benchmarks.atomic_output import replaced, save_figure
from benchmarks.flags import add_output_options, output_folder

# (name, wrapper, strategy, fsdp_reduce, reshard_after_forward)
CONFIGS = [
    ("ddp full batch", "ddp", "full", "chunk", True),
    ("ddp gradcache", "ddp", "gradcache", "chunk", True),
    ("fsdp full batch", "fsdp", "full", "chunk", True),
    ("fsdp gradcache reduce/chunk", "fsdp", "gradcache", "chunk", True),
    ("fsdp gradcache reduce/step", "fsdp", "gradcache", "step", True),
    ("fsdp gradcache keep-gathered", "fsdp", "gradcache", "chunk", False),
]
COUNTED = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
           "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4], help="default: 1 2 4")
    parser.add_argument("--width", type=int, default=1536, help="hidden width of the encoder (default: 1536)")
    parser.add_argument("--depth", type=int, default=4, help="hidden layers, one FSDP unit each (default: 4)")
    parser.add_argument("--batch", type=int, default=512, help="global batch, split over ranks (default: 512)")
    parser.add_argument("--chunk", type=int, default=64, help="GradCache chunk size (default: 64)")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per point (default: 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank; 0: cores / world size (default: 1, see the module docstring)")
    add_output_options(parser, "sharding")
    return parser


def encoder(width: int, depth: int) -> nn.Sequential:
    layers = [nn.Linear(64, width), nn.GELU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 128))


def _rss() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process in bytes, from /proc/self/status."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _count_collectives():
    counts = dict.fromkeys(COUNTED, 0)
    for key, names in COUNTED.items():
        name = next(n for n in names if hasattr(dist, n))
        original = getattr(dist, name)

        def wrapper(*args, _key=key, _original=original, **kwargs):
            counts[_key] += 1
            return _original(*args, **kwargs)
        setattr(dist, name, wrapper)
    return counts


def _rank(rank: int, world_size: int, port: int, folder: str, config: tuple, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world_size))
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: big blocks go back to the OS when freed
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    name, wrapper, strategy_name, fsdp_reduce, reshard = config
    baseline, _ = _rss()
    Path("/proc/self/clear_refs").write_text("5")  # restart the peak from here
    torch.manual_seed(0)
    model = encoder(args.width, args.depth)
    if wrapper == "fsdp":
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, reshard_after_forward=reshard)
        wrapped = fully_shard(model, reshard_after_forward=reshard)
    else:
        wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cls = GradCache if strategy_name == "gradcache" else FullBatch
    strategy = cls(wrapped, NTXent(temperature=0.1), args.chunk, fsdp_reduce=fsdp_reduce)
    local = args.batch // world_size
    g = torch.Generator().manual_seed(rank)
    views = torch.randn(local, 64, generator=g), torch.randn(local, 64, generator=g)

    def step() -> None:
        strategy.step(*views)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: AdamW's state is allocated here
    times = []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    counts = _count_collectives()
    step()
    _, peak = _rss()
    result = {"config": name, "world_size": world_size, "peak_mb": (peak - baseline) / 2**20,
              "step_s": statistics.median(times), **counts}
    torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def run_point(config: tuple, world_size: int, args: argparse.Namespace) -> dict:
    with socket.socket() as s, tempfile.TemporaryDirectory() as folder:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.start_processes(_rank, args=(world_size, port, folder, config, args), nprocs=world_size, join=True,
                           start_method="fork")
        ranks = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(world_size)]
    row = dict(ranks[0])
    row["peak_mb"] = max(r["peak_mb"] for r in ranks)  # the rank that needs the most
    row["step_s"] = max(r["step_s"] for r in ranks)
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, seconds) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["config"] for r in rows):
        points = [r for r in rows if r["config"] == name]
        sizes = [r["world_size"] for r in points]
        memory.plot(sizes, [r["peak_mb"] for r in points], marker="o", label=name)
        seconds.plot(sizes, [r["step_s"] for r in points], marker="o", label=name)
    memory.set(xlabel="ranks", ylabel="peak RSS per rank above baseline (MiB)", title="memory per rank")
    seconds.set(xlabel="ranks", ylabel="seconds per step", title="step time (ranks share 2 cores)")
    for axis in (memory, seconds):
        axis.set_xticks(sorted({r["world_size"] for r in rows}))
    memory.legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    args = get_args_parser().parse_args(argv)
    rows = []
    for world_size in args.world_sizes:
        for config in CONFIGS:
            row = run_point(config, world_size, args)
            rows.append(row)
            print(f"{row['config']:30s} ranks={world_size}  peak/rank {row['peak_mb']:8.1f} MiB  "
                  f"step {row['step_s']:6.3f} s  all-gather {row['all_gather']:3d}  "
                  f"reduce-scatter {row['reduce_scatter']:3d}", flush=True)
    output = output_folder(args)
    with replaced(output / f"{args.name}.csv", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, output / f"{args.name}.png")
    return rows


if __name__ == "__main__":
    main()
