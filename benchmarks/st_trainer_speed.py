"""Training-step throughput of the default `gradcache train text` run against sentence-transformers' own trainer
(`SentenceTransformerTrainer` with `CachedMultipleNegativesRankingLoss`) on the same model, data, batch,
mini-batch, max length, learning rate and hard negatives.

Ours is the training program's own step: the `Run` that `gradcache train text` builds from its defaults (plus any
options after `--`), fed by its own data loader (tokenising included), one optimizer step each. Theirs is the
trainer's `training_step` on batches of its own data loader and collator, then its optimizer and scheduler step,
with CachedMNRL at scale 1/temperature and mini_batch_size = our --chunk-size. Both start from the packaged
all-MiniLM-L6-v2 weights, in train mode (dropout on), in one process with the same torch threads.

Round robin: each round runs `--steps-per-round` steps of each side, the order alternating, after a warm-up
round; the figures are medians over rounds of the seconds per step, the ratio the median of the per-round ratios
(rows per second, ours over theirs). The load average is printed before and after.

    python -m benchmarks.st_trainer_speed --rounds 2 --steps-per-round 1        # sanity pass
    python -m benchmarks.st_trainer_speed --rounds 9 --write-results            # the figure, on an idle machine
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_output_options, output_folder
from benchmarks.report import machine_context, print_table, write_csv

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local models only
SIDES = ("gradcache_train_text", "st_trainer_cached_mnrl")
COLUMNS = ["side", "batch", "mini_batch", "negatives", "max_length", "rounds", "steps_per_round", "step_s",
           "rows_per_s", "ratio_to_st", "peer_version", *machine_context(0, "cpu")]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds (median reported; 9 for a figure)")
    parser.add_argument("--steps-per-round", type=int, default=2, help="training steps of each side per round")
    parser.add_argument("train_options", nargs="*", help="after --: options of gradcache train text (default: none)")
    add_output_options(parser, "st_trainer_speed")
    return parser


def ours(train_options: Sequence[str], steps: int, folder: Path):
    """The default text run's Run and an iterator over its batches; `steps` steps long; `finish` undoes setup."""
    from gradcache.train.cli import get_args_parser as cli_parser
    from gradcache.train.data.order import StepSampler
    from gradcache.train.modes import MODES
    from gradcache.train.train_options import config_from_args, explicit_options
    from gradcache.train.parallel.placement_choice import placement_for
    from gradcache.train.preflight import prepare_run
    from gradcache.train.run import Run

    argv = ["train", "text", "--steps", str(steps), "--test-size", "32", "--quiet", "--output-dir", str(folder),
            *train_options]
    args = cli_parser().parse_args(argv)
    config, _, data, lock = prepare_run(config_from_args(args), explicit_options(MODES["text"], argv))
    lock.__enter__()  # the run folder is this benchmark's until `close`
    placement = placement_for(config)
    group = placement.process_group()
    group.__enter__()
    run = Run(config, data, placement)  # evaluates step 0 on the 32 held-out rows: not timed
    run.model.train()
    sampler = StepSampler(len(data.train), config.batch_size, config.seed, 0, run.steps, 0, 1)
    batches = iter(run.mode.batches(config, data, sampler))
    counter = iter(range(run.steps))

    def step() -> None:
        run.step(next(batches), next(counter))
    def close() -> None:
        group.__exit__(None, None, None)
        lock.__exit__(None, None, None)

    return config, data, step, close


def theirs(config, data, steps: int, folder: Path) -> Callable[[], None]:
    """SentenceTransformerTrainer's step with CachedMNRL on the same rows, in the order of its own sampler."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

    from gradcache.models.huggingface_folder import model_folder

    model = SentenceTransformer(str(model_folder(config.model)), device=config.device)
    model.max_seq_length = config.max_length
    columns = {"anchor": data.train.queries, "positive": data.train.positives}
    for k in range(data.train.negatives_per_query):
        columns[f"negative_{k}"] = [row[k] for row in data.train.negatives]
    loss = CachedMultipleNegativesRankingLoss(model, scale=1.0 / config.temperature, mini_batch_size=config.chunk_size)
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=config.batch_size, learning_rate=config.lr,
        warmup_steps=config.warmup, weight_decay=config.weight_decay, max_steps=steps, report_to="none",
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0, use_cpu=config.device == "cpu",
        seed=config.seed, dataloader_drop_last=True)
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=Dataset.from_dict(columns),
                                         loss=loss)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    trainer.current_gradient_accumulation_steps = 1  # what its train loop sets before each step: no accumulation
    batches: Iterator[dict[str, Any]] = iter(trainer.get_train_dataloader())

    def step() -> None:
        trainer.training_step(model, next(batches))
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad(set_to_none=True)
    return step


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    steps = (args.rounds + 1) * args.steps_per_round
    with tempfile.TemporaryDirectory() as scratch:
        config, data, our_step, finish = ours(args.train_options, steps, Path(scratch) / "ours")
        try:
            sides = {SIDES[0]: our_step, SIDES[1]: theirs(config, data, steps, Path(scratch) / "theirs")}
            load_before = os.getloadavg()
            print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} (cpu_count "
                  f"{os.cpu_count()}, threads {torch.get_num_threads()}); batch {config.batch_size}, mini-batch "
                  f"{config.chunk_size}, {config.negatives_per_query} hard negatives, max length {config.max_length}",
                  flush=True)
            times = round_robin(sides, args.rounds, args.steps_per_round)
        finally:
            finish()
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    ratios = [t / o for o, t in zip(times[SIDES[0]], times[SIDES[1]])]  # our rows/s over theirs
    context = machine_context(torch.get_num_threads(), "cpu")
    rows = [{"side": name, "batch": config.batch_size, "mini_batch": config.chunk_size,
             "negatives": config.negatives_per_query, "max_length": config.max_length, "rounds": args.rounds,
             "steps_per_round": args.steps_per_round, "step_s": statistics.median(times[name]),
             "rows_per_s": config.batch_size / statistics.median(times[name]),
             "ratio_to_st": statistics.median(ratios) if name == SIDES[0] else 1.0,
             "peer_version": version("sentence-transformers"), **context} for name in SIDES]
    print_table(rows, ["side", "step_s", "rows_per_s", "ratio_to_st", "loadavg_1m"])
    print(f"throughput of gradcache train text / sentence-transformers' trainer: {rows[0]['ratio_to_st']:.3f}")
    path = output_folder(args) / f"{args.name}.csv"
    write_csv(path, rows, COLUMNS)
    print(f"wrote {path}")
    return 0


def round_robin(sides: dict[str, Callable[[], None]], rounds: int, per_round: int) -> dict[str, list[float]]:
    """Seconds per step of each side per round; one untimed warm-up round first; the order alternates."""
    names = list(sides)
    for name in names:
        for _ in range(per_round):
            sides[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            for _ in range(per_round):
                sides[name]()
            times[name].append((time.perf_counter() - started) / per_round)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.2f} s/step" for n, t in times.items()),
              file=sys.stderr, flush=True)
    return times


if __name__ == "__main__":
    sys.exit(main())
