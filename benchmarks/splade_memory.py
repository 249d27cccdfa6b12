"""Peak memory of one cached SPLADE step: GradCacheSpladeLoss (sparse and dense cache) beside sentence-transformers'
CachedSpladeLoss, on the same SparseEncoder, batch and chunk, N growing.

Modes: ``peer`` (``CachedSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), ...)``), ``dense``
(``GradCacheSpladeLoss(..., sparse_cache=False)``: (N, V) rows cached, as the peer does) and ``sparse``
(``GradCacheSpladeLoss(...)``, the default: rows and their gradients cached by their non-zeros). The model is the
issue's (BERT ``--dim`` 64 wide, one layer, two heads, a ``--vocab`` 30,522-token WordPiece vocabulary written
here, dropout 0) with its MLM head's bias shifted so that about ``--positive-fraction`` (0.1%) of the logits of a
sample batch are positive, as in a trained SPLADE. Data: generated (anchor, positive, negative) texts of random
vocabulary words, queries of 4-12 words, passages of 10-30. Each point runs in a fresh process
(``fresh_process.py``): the child builds the model and the batch, runs one step on two rows (each library's
first-call initialisation, not counted), resets the peak-RSS mark, runs one forward + backward through the loss
(the trainer's sum of the returned parts) and reports the peak above that baseline (CPU: VmHWM with
``MALLOC_MMAP_THRESHOLD_`` so it follows live tensors, as the other memory benchmarks here; ``--heap default``
keeps glibc's own threshold, whose retained heap adds hundreds of MB; CUDA: ``torch.cuda.max_memory_allocated``),
then the median time of ``--repeats`` more. With ``--rounds R``, one more fresh process per N times the modes
in R interleaved rounds (``round_robin.py``), whose medians replace those times, with the per-round ratio of
sparse to peer. Nothing here touches the network.

    python -m benchmarks.splade_memory                               # N = 64, 256, 1,024, chunk 16, all modes
    python -m benchmarks.splade_memory --sizes 512 --modes peer,sparse --device cuda
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, choices, output_folder
from benchmarks.fresh_process import LIVE_TENSORS_ENV, measured_step, report, run_point
from benchmarks.report import machine_context, plot_lines, print_table, write_csv
from benchmarks.round_robin import medians, per_round_ratio, round_robin

GB = 2**30
MODES = ("peer", "dense", "sparse")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
COLUMNS = ["mode", "n", "chunk", "dim", "vocab", "positive_fraction", "heap", "status", "peak_gb", "step_s", "runs",
           "loss_value", "nonzero_fraction", "time_ratio", "process_s", "error", "device", "threads", "cpu_count",
           "loadavg_1m", "loadavg_5m", "torch_version", "gradcache_version", "python_version", "timestamp_utc"]
TABLE = ["mode", "n", "status", "peak_gb", "step_s", "runs", "time_ratio", "loss_value", "nonzero_fraction",
         "loadavg_1m"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="comma-separated batch sizes N")
    parser.add_argument("--modes", default="peer,dense,sparse", help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--chunk", type=int, default=16, help="rows per chunk (the peer's mini_batch_size)")
    parser.add_argument("--dim", type=int, default=64, help="BERT hidden width")
    parser.add_argument("--vocab", type=int, default=30522, help="vocabulary size V (the rows' width)")
    parser.add_argument("--positive-fraction", type=float, default=0.001,
                        help="share of a sample batch's MLM logits left positive by the bias shift")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs after the measured one (median)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="interleaved timing rounds of the modes per N, in one more fresh process (0: none); "
                             "their medians replace the memory points' times")
    parser.add_argument("--rounds-up-to", type=int, default=1024, help="time in rounds only the N up to this")
    parser.add_argument("--heap", choices=("live", "default"), default="live",
                        help="CPU only: live maps every block of 64 KiB or more on its own (peak RSS follows the "
                             "live tensors); default keeps glibc's threshold, and its retained heap")
    parser.add_argument("--long-run-s", type=float, default=20.0,
                        help="a point whose first run takes longer reports that run's time alone")
    add_shared_options(parser, "splade_memory", threads=os.cpu_count(), memory_budget_gb=12.0, time_budget_s=900.0)
    return parser


def words(vocab: int) -> list[str]:
    """The vocabulary's whole words: everything after the special tokens."""
    return [f"w{i}" for i in range(vocab - len(SPECIAL))]


def build_model(folder: Path, dim: int, vocab: int, positive_fraction: float, sample: list[str]):
    """A SparseEncoder (MLM BERT, one layer, two heads, max pooling of log(1 + relu)) with its head's bias shifted
    so that `positive_fraction` of the logits of `sample` are positive."""
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    (folder / "vocab.txt").write_text("\n".join(SPECIAL + words(vocab)) + "\n", encoding="utf-8")
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, hidden_size=dim, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=4 * dim, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=64)
    mlm = BertForMaskedLM(config)
    tokenizer = BertTokenizer.from_pretrained(folder)
    with torch.no_grad():
        batch = tokenizer(sample, padding=True, return_tensors="pt")
        logits = mlm(**batch).logits[batch["attention_mask"].bool()]  # (tokens, V)
        flat = logits.flatten()
        k = max(1, int(flat.numel() * positive_fraction))
        mlm.cls.predictions.bias -= flat.topk(k).values[-1].item()  # the k-th largest logit becomes 0
    mlm.save_pretrained(folder)
    return SparseEncoder(modules=[MLMTransformer(str(folder)), SpladePooling("max")], device="cpu")


def texts(n: int, vocab: int, low: int, high: int, rng: random.Random) -> list[str]:
    pool = words(vocab)
    return [" ".join(rng.choice(pool) for _ in range(rng.randint(low, high))) for _ in range(n)]


def prepare(point: dict[str, Any], folder: Path) -> tuple[Any, list[list[str]], Callable, float]:
    """The point's model and generated text columns, the function that tokenises columns onto the device, and the
    share of non-zeros in the positives' rows."""
    rng = random.Random(0)
    n, vocab = point["n"], point["vocab"]
    columns = [texts(n, vocab, 4, 12, rng), texts(n, vocab, 10, 30, rng), texts(n, vocab, 10, 30, rng)]
    model = build_model(folder, point["dim"], vocab, point["positive_fraction"], columns[1][:64])
    device = torch.device(point["device"])
    model.to(device)

    def features_of(texts: list[list[str]]) -> list[dict[str, Any]]:
        return [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in model.preprocess(c).items()}
                for c in texts]

    with torch.no_grad():
        rows = model(features_of(columns[1:2])[0])["sentence_embedding"]
        nonzero = float((rows != 0).float().mean())
    return model, columns, features_of, nonzero


def build_loss(mode: str, model: Any, chunk: int) -> torch.nn.Module:
    """`peer`: CachedSpladeLoss; `dense` / `sparse`: GradCacheSpladeLoss with the dense or the sparse cache."""
    from sentence_transformers.sparse_encoder.losses import CachedSpladeLoss, SparseMultipleNegativesRankingLoss

    from gradcache.integrations.sentence_transformers import GradCacheSpladeLoss

    base = SparseMultipleNegativesRankingLoss(model)
    if mode == "peer":
        return CachedSpladeLoss(model, base, 3e-5, 5e-5, mini_batch_size=chunk)
    return GradCacheSpladeLoss(model, base, 3e-5, 5e-5, chunk_size=chunk, sparse_cache=mode == "sparse")


def step_of(loss: torch.nn.Module, model: Any, features: list[dict[str, Any]],
            device: torch.device) -> Callable[[], float]:
    """One forward + backward through `loss` (the trainer's sum of the returned parts) on `features`."""

    def step() -> float:
        model.zero_grad(set_to_none=True)
        parts = loss(features, None)
        total = sum(parts.values())
        total.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return float(total.detach())

    return step


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: a memory point (one mode: one step measured after one on two rows, then the median time of
    `repeats` more) or a timing point (the modes in interleaved rounds)."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    with tempfile.TemporaryDirectory() as folder:
        model, columns, features_of, nonzero = prepare(point, Path(folder))
    features = features_of(columns)
    if point["kind"] == "time":
        steps = {mode: step_of(build_loss(mode, model, point["chunk"]), model, features, device)
                 for mode in point["modes"]}
        times = round_robin(steps, point["rounds"], device)
        result = {"status": "ok", "step_s": medians(times), "rounds": point["rounds"]}
        if "sparse" in steps and "peer" in steps:
            result["time_ratio"] = per_round_ratio(times, "sparse", ["peer"])
        return result
    loss = build_loss(point["mode"], model, point["chunk"])
    step_of(loss, model, features_of([c[:2] for c in columns]), device)()  # initialisation, not counted
    step = step_of(loss, model, features, device)
    return {"status": "ok", **measured_step(step, device, point["memory_budget_gb"], point["repeats"],
                                            point["long_run_s"]), "nonzero_fraction": nonzero}


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    modes = choices(args.modes, MODES, "--modes")
    sizes = sorted({int(size) for size in args.sizes.split(",") if size})
    settings = {"chunk": args.chunk, "dim": args.dim, "vocab": args.vocab, "positive_fraction": args.positive_fraction,
                "threads": args.threads, "device": args.device, "memory_budget_gb": args.memory_budget_gb}
    env = LIVE_TENSORS_ENV if args.heap == "live" and args.device == "cpu" else None
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for n in sizes:
            point = {**settings, "kind": "memory", "mode": mode, "n": n, "repeats": args.repeats,
                     "long_run_s": args.long_run_s}
            row = {**{k: point[k] for k in ("mode", "n", "chunk", "dim", "vocab", "positive_fraction")},
                   "heap": args.heap, **machine_context(args.threads, args.device)}
            row.update(run_point(__spec__.name, point, args.time_budget_s, env))
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
            rows.append(row)
    if args.rounds > 0:
        for n in [size for size in sizes if size <= args.rounds_up_to]:
            timed = run_point(__spec__.name, {**settings, "kind": "time", "n": n, "modes": modes,
                                              "rounds": args.rounds}, args.time_budget_s)
            for row in (row for row in rows if row["n"] == n):
                if timed.get("status") == "ok":
                    row.update(step_s=timed["step_s"][row["mode"]], runs=timed["rounds"],
                               time_ratio=timed.get("time_ratio", ""))
                else:
                    row["error"] = f"timing: {timed.get('status')} {timed.get('error', '')}".strip()
            print(json.dumps({"n": n, **{k: v for k, v in timed.items() if k != "process_s"}}), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    rows = run_sweep(args)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS)
    plot_lines(output_dir / f"{args.name}.png", rows, "n", [("peak_gb", "peak memory above baseline (GB)"),
               ("step_s", "step time (s)")], "mode",
               f"cached SPLADE step, BERT {args.dim} wide, V={args.vocab}, chunk {args.chunk}, ~"
               f"{args.positive_fraction:.2%} logits positive, {args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    return rows


if __name__ == "__main__":
    main()
