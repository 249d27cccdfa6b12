"""The training loop of `gradcache train <mode>`: one strategy step and one optimizer step per global batch.

    run = Run(config, data, placement, saved)   # model, loss, optimizer, schedule, strategy, checkpoint, at
                                                # step 0 (evaluated) or at the step of the checkpoint it continues
    for each step s from there: batch s of the data order (a function of seed and step), this rank's slice
        loss = run.step(inputs)    # strategy.step writes .grad; scaler.step; zero_grad; schedule; mode's hook;
                                   # the ranks agree on divergence (raises) and on a stop signal
        log; every N steps (and on a stop signal: then raise Preempted) a checkpoint; (optionally) an evaluation
    the final evaluation, RUN/model/ (the model in its users' format: gradcache/train/export/), metrics.json,
    curves.png

What differs between modes is in the mode (gradcache/train/modes/); what differs between replicated and
sharded parameters is in the placement (gradcache/train/parallel/placement.py). Rank 0 alone writes the logs.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from torch import nn

from gradcache import distributed, negatives_per_anchor
from gradcache.losses.queue import queued_negatives
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.splits import Splits
from gradcache.train.data.worker_failures import dead_worker
from gradcache.train.errors import Preempted, TrainingDiverged, exit_status_of
from gradcache.train.export.write import MODEL_FOLDER, export_model
from gradcache.train.matryoshka_dims import unwrapped
from gradcache.train.modes import mode_of
from gradcache.train.parallel.placement import Placement
from gradcache.train.parallel.placement_choice import placement_for
from gradcache.train.preemption import StopSignals
from gradcache.train.progress import StepProgress
from gradcache.train.run import Run, any_rank, peak_memory_mb
from gradcache.train.run_folder.log import RunLog

__all__ = ["train", "TrainingDiverged", "Preempted"]


def train(config: RunConfig, saved: RunCheckpoint | None = None, data: Splits | None = None) -> dict[str, Any]:
    """Run (or, given `saved`, continue) training; return the run summary also written to metrics.json.

    Raises:
        TrainingDiverged: a non-finite loss, embedding, gradient or weight (no checkpoint of it is written).
        errors.DataWorkerFailed: a data-loader worker raised an error or was killed (data/worker_failures.py).
        Preempted: SIGTERM or SIGINT once training started; the step in progress finished and its checkpoint
            was saved.
        KeyboardInterrupt: SIGTERM or SIGINT before training started (loading data, building the model, loading
            the checkpoint, evaluating step 0): nothing trained, nothing saved.

    A second signal ends the process at once with status INTERRUPTED, the previous checkpoint intact.
    """
    placement = placement_for(config)
    # `closing` closes the log (its --report-to writers) on every way out: the end, an error, a pre-emption
    with placement.process_group(), StopSignals() as signals, ExitStack() as closing:
        try:
            return _train(config, saved, data if data is not None else mode_of(config).load_data(config),
                          placement, signals, closing)
        except RuntimeError as error:  # torch's SIGCHLD handler reports a dead worker wherever the loop was
            failure = None if exit_status_of(error) is not None else dead_worker()
            if failure is None:
                raise
            raise failure from None


def _train(config: RunConfig, saved: RunCheckpoint | None, data: Splits, placement: Placement,
           signals: StopSignals, closing: ExitStack) -> dict[str, Any]:
    rank, world_size = distributed.rank(), distributed.world_size()
    run = Run(config, data, placement, saved)  # step 0 evaluated, or the checkpoint loaded; nothing written
    progress = run.progress
    log = closing.enter_context(RunLog(config.output_dir, resume_step=progress.start_step if saved is not None
                                       else None, enabled=rank == 0, report_to=config.report_to,
                                       run_options=config.to_dict()))
    if saved is None:
        log.log_eval(0, progress.initial)
    sampler = StepSampler(len(data.train), config.batch_size, config.seed, progress.start_step, run.steps, rank,
                          world_size)
    negatives = negatives_per_anchor(config.strategy, run.mode.negatives_loss, config.batch_size, config.chunk_size,
                                     world_size, run.mode.hard_negatives(config))  # in-batch; the log adds the queue
    bar = StepProgress(run.steps, progress.start_step, f"gradcache train {config.mode}", config.progress_every,
                       enabled=not config.quiet and rank == 0)
    run.model.train()
    signals.defer()  # until here a signal stopped at once; from here it lets the step in progress finish and save
    loss = None  # a resume of a finished run trains no step
    waited_from = run.elapsed()  # samples_per_s counts the wait for each batch too, not the step alone
    waited = stepped = 0.0  # seconds waiting for batches and seconds of whole steps (wait included), this run
    for step, inputs in enumerate(run.mode.batches(config, data, sampler), start=progress.start_step):
        wait = run.elapsed() - waited_from  # the loader had no batch ready: decoding or tokenising is behind
        queued = queued_negatives(run.loss)  # the queue this step reads (as it starts)
        result = run.step(inputs, step, stop_requested=signals.received is not None)
        loss = result.loss
        seconds = run.elapsed() - waited_from
        waited, stepped = waited + wait, stepped + seconds
        row = {"step": step + 1, "epoch": sampler.position(step)[0], "loss": f"{loss.item():.6f}",
               "lr": f"{result.learning_rate:.6g}", "samples_per_s": f"{config.batch_size / seconds:.1f}",
               "data_wait_s": f"{wait:.4f}",
               "negatives_per_anchor": negatives + queued, "temperature": f"{unwrapped(run.loss).temperature:.5g}",
               "elapsed_s": f"{run.elapsed():.2f}", "skipped": int(result.skipped)}
        log.log_step(row)
        bar.update(row)
        done = step + 1
        stop = result.stop
        if done % config.checkpoint_every == 0 or done == run.steps or stop:
            run.save(done, sampler.position(done))
            log.flush()  # the reporters' rows up to the checkpoint are on disk, as the CSV's are
            # a signal during the save stops at the checkpoint it wrote, not after one more step (ranks agree)
            stop = stop or any_rank([signals.received is not None])[0]
        if stop and done != run.steps:
            bar.close()
            raise _preempted(config, signals.received or "a stop signal on another rank", done, run, rank)
        if placement.evaluates() and config.eval_every and done % config.eval_every == 0 and done != run.steps:
            log.log_eval(done, run.evaluate())
        waited_from = run.elapsed()  # saves and evaluations are not the next batch's
    bar.close()
    wall_time = run.elapsed()
    final = run.evaluate() if placement.evaluates() else {}
    # RUN/model/ after the final checkpoint: the weights in the format the mode's users load (every rank gathers)
    whole = placement.whole(run.trained, lambda: nn.ModuleDict({"model": run.mode.build_model(config),
                                                               "loss": run.mode.build_loss(config)}))
    if whole is not None:
        export_model(config, whole["model"], whole["loss"], Path(config.output_dir) / MODEL_FOLDER, final,
                     mode=run.mode)
    if rank != 0:
        return {}
    log.log_eval(run.steps, final)
    summary = {**final, **progress.baselines, "step0": progress.initial, "steps": run.steps,
               "wall_time_s": round(wall_time, 2), "peak_memory_mb": round(peak_memory_mb(run.device), 1),
               "train_size": len(data.train), "test_size": len(data.test),
               f"skipped_{run.mode.items}": len(data.train.skipped),
               "batch_size": config.batch_size, "strategy": config.strategy,
               "negatives_per_anchor": negatives + queued_negatives(run.loss),  # the queue as the run ended
               "final_loss": None if loss is None else float(loss), "skipped_steps": log.skipped_steps(),
               "data_wait_share": round(waited / stepped, 4) if stepped else None,
               "data": data.name, **run.mode.summary(run.loss)}
    log.write_metrics(summary)
    log.plot()
    return summary


def _preempted(config: RunConfig, signal_name: str, step: int, run: Run, rank: int) -> Preempted:
    return Preempted(f"stopped by {signal_name} after step {step} of {run.steps}; saved {run.checkpoint} (step {step}, "
                     f"with the data position). Resume with: gradcache train {config.mode} --resume "
                     f"{config.output_dir}", rank)
