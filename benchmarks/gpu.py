"""What only a GPU can show, in one run of a few minutes: exactness of every strategy on CUDA (dropout replayed
on the CUDA generator, bf16 autocast, fp16 with a GradScaler, memory_budget, chunk_tokens), a frontier at a
few budgets by `torch.cuda.max_memory_allocated`, and the tiled ClipLoss at N = 262,144 and 1,048,576 (D = 512).
Without CUDA it runs the same code at smoke size on the CPU.

    python -m benchmarks.gpu --device cuda --write-results     # on one GPU, under 8 minutes
    python -m benchmarks.gpu                                    # CPU smoke size
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from benchmarks.arguments import HelpFormatter, add_output_options, output_folder
from benchmarks.report import machine_context, print_table, write_csv
from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation, losses

MB = 2**20
COLUMNS = ["section", "case", "status", "max_rel_error", "tolerance", "peak_mb", "step_s", "n", "device",
           "loadavg_1m", "torch_version", "timestamp_utc"]


class TokenTower(nn.Module):
    """Embedding, a dropout MLP per position, masked mean pooling: ignores padding, so token chunks are exact."""

    def __init__(self, vocab: int = 1000, width: int = 256, out: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width))
        self.proj = nn.Linear(width, out)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.mix(self.embed(input_ids))  # (B, L, W)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.proj((hidden * mask).sum(1) / mask.sum(1).clamp_min(1))  # (B, out)


def image_tower(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(3 * 16 * 16, width), nn.GELU(), nn.Dropout(0.1), nn.Linear(width, 128))


def make_batch(n: int, length: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3 * 16 * 16, generator=g)
    lengths = torch.where(torch.rand(n, generator=g) < 0.1, length, torch.randint(1, max(2, length // 6), (n,), generator=g))
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 1000, (n, length), generator=g) * mask
    return images.to(device), {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def grads(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for m in modules for p in m.parameters() if p.grad is not None]


def run_case(make: Callable[[], Any], modules: Sequence[nn.Module], batch: tuple, seed: int,
             scaler: Any = None) -> list[torch.Tensor]:
    for m in modules:
        m.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same CUDA generator state for every strategy of a comparison
    strategy = make()
    if isinstance(strategy, CachedLoss):
        loss = strategy(*batch)
        (scaler.scale(loss) if scaler is not None else loss).backward()
    else:
        strategy.step(*batch)
    found = grads(modules)
    if scaler is not None:
        found = [g / scaler.get_scale() for g in found]
    return found


def max_rel_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    scale = max(w.abs().max().item() for w in want)
    return max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want)) / scale


def exactness(device: torch.device, n: int, chunk: int, length: int, width: int) -> list[dict[str, Any]]:
    """Each case against its reference on the device; dropout on, so the masks must be replayed exactly."""
    torch.manual_seed(0)
    image, text = image_tower(2 * width).to(device), TokenTower(width=width).to(device)
    loss = losses.ClipLoss(temperature=0.07, learnable=True).to(device)
    modules, towers = [image, text, loss], [image, text]
    batch = make_batch(n, length, device)
    graph, half_graph = 10**12, _half_graph(image, batch, chunk)  # measured here: it draws dropout masks
    rows = []
    reference = run_case(lambda: GradCache(towers, loss, chunk), modules, batch, 1)  # dropout on: GradCache is
    cases = {  # the reference (a full batch draws other masks); every option must reproduce its gradient
        "cached_loss": (lambda: CachedLoss(towers, loss, chunk), None, 1e-5),
        "memory_budget_half": (lambda: GradCache(towers, loss, chunk, memory_budget=half_graph), None, 1e-5),
        "memory_budget_all": (lambda: GradCache(towers, loss, chunk, memory_budget=graph), None, 1e-5),
    }
    for name, (make, scaler, tolerance) in cases.items():
        rows.append(_row("exactness", name, max_rel_error(run_case(make, modules, batch, 1, scaler), reference), tolerance))
    image.eval(), text.eval()  # against FullBatch: no dropout
    want = run_case(lambda: FullBatch(towers, loss), modules, batch, 2)
    half = {
        "chunk_tokens": (lambda: GradCache(towers, loss, chunk, chunk_tokens=[None, chunk * length // 4]), None, 1e-5),
        "bf16_autocast": (lambda: GradCache(towers, loss, chunk, autocast_dtype=torch.bfloat16), None, 5e-2),
        "fp16_grad_scaler": (lambda: CachedLoss(towers, loss, chunk, autocast_dtype=torch.float16),
                             torch.amp.GradScaler(device.type, init_scale=2.0**12), 5e-2),
        "naive_differs": (lambda: NaiveAccumulation(towers, loss, chunk), None, None),
    }
    for name, (make, scaler, tolerance) in half.items():
        rows.append(_row("exactness", name, max_rel_error(run_case(make, modules, batch, 2, scaler), want), tolerance))
    return rows


def _half_graph(image: nn.Module, batch: tuple, chunk: int) -> int:
    """About half the image tower's graphs over the batch, as `memory_budget` counts them."""
    from gradcache.graph_memory import saved_bytes

    with torch.enable_grad(), saved_bytes([*image.parameters(), batch[0]]) as graph:
        image(batch[0][:chunk])
    return graph.total * (batch[0].shape[0] // chunk) // 2


def _row(section: str, case: str, error: float, tolerance: float | None) -> dict[str, Any]:
    ok = error > 1e-3 if tolerance is None else error <= tolerance  # the negative control must differ
    return {"section": section, "case": case, "status": "ok" if ok else "FAILED", "max_rel_error": error,
            "tolerance": tolerance if tolerance is not None else "> 1e-3"}


def timed(step: Callable[[], Any], device: torch.device, rounds: int) -> tuple[float, float]:
    """(median seconds, peak MiB above the memory held before) of `step`."""
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated(device) - base) / MB if device.type == "cuda" else float("nan")
    return statistics.median(times), peak


def frontier(device: torch.device, n: int, chunk: int, length: int, rounds: int, width: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    image, text = image_tower(4 * width).to(device), TokenTower(width=width).to(device)
    loss = losses.ClipLoss(temperature=0.07, learnable=True).to(device)
    towers, batch = [image, text], make_batch(n, length, device)
    full = 2 * _half_graph(image, batch, chunk) * 4  # both towers, generously: "budget_100" keeps every chunk
    configs = {"full_batch": FullBatch(towers, loss), "naive": NaiveAccumulation(towers, loss, chunk),
               **{f"budget_{p}": GradCache(towers, loss, chunk, memory_budget=full * p // 100) for p in (0, 50, 100)},
               "chunk_tokens": GradCache(towers, loss, chunk, chunk_tokens=[None, chunk * length // 4])}
    rows = []
    for name, strategy in configs.items():
        def step(strategy=strategy) -> None:
            strategy.step(*batch)
            for m in (image, text, loss):
                m.zero_grad(set_to_none=True)
        seconds, peak = timed(step, device, rounds)
        rows.append({"section": "frontier", "case": name, "status": "ok", "step_s": seconds, "peak_mb": peak, "n": n})
    return rows


def tiled_clip(device: torch.device, sizes: Sequence[int], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        image = torch.randn(n, 512, device=device, requires_grad=True)
        text = torch.randn(n, 512, device=device, requires_grad=True)
        loss_fn = losses.ClipLoss(temperature=0.07, learnable=False, tile_size=8192 if n > 8192 else 256).to(device)

        def step() -> None:
            loss_fn(image, text).backward()
            image.grad = text.grad = None
        seconds, peak = timed(step, device, rounds)
        rows.append({"section": "tiled_clip", "case": f"N={n}", "status": "ok", "step_s": seconds, "peak_mb": peak, "n": n})
    return rows


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration (median)")
    add_output_options(parser, "gpu")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    device = torch.device(args.device)
    smoke = device.type != "cuda"
    n, chunk, length, width = (24, 8, 16, 32) if smoke else (4096, 256, 256, 512)
    rows = exactness(device, n, chunk, length, width)
    rows += frontier(device, 2 * n if smoke else 16384, chunk, length, 1 if smoke else args.rounds, width)
    rows += tiled_clip(device, (1024,) if smoke else (262_144, 1_048_576), 1)  # N = 1M: about a minute a step
    context = machine_context(torch.get_num_threads(), args.device)
    rows = [{**row, **context} for row in rows]
    folder = output_folder(args)
    write_csv(folder / f"{args.name}.csv", rows, COLUMNS)
    (folder / f"{args.name}.json").write_text(json.dumps(rows, indent=1, default=str))
    print_table(rows, ["section", "case", "status", "max_rel_error", "peak_mb", "step_s"])
    print(f"wrote {folder}/{args.name}.csv and .json ({'smoke size on CPU' if smoke else 'GPU sizes'})")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
