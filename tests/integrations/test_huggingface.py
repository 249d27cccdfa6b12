"""GradCacheTrainer: one Trainer step (accumulated, bf16, under DDP on two gloo ranks) against FullBatch on the
batches the Trainer drew, on every parameter, the learnable temperature included."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from gradcache import CachedLoss  # noqa: E402
from gradcache.integrations.huggingface import GradCacheTrainer  # noqa: E402
from tests.integrations.towers import (  # noqa: E402
    CHUNK, Pairs, assert_same_grads, build_towers, collate, concatenated, count_allreduces,
    ordinary_step_allreduces, reference_grads,
)
from tests.multiprocess import run_on_ranks  # noqa: E402


class Recording(GradCacheTrainer):
    """Keeps every batch compute_loss saw, the gradients before each optimizer step, and, under DDP, the
    all-reduce calls of the Trainer's wrapper."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches, self.grads, self.allreduces = [], [], None
        self.add_callback(_GradientsBeforeStep(self.grads))

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        if isinstance(model, DistributedDataParallel) and self.allreduces is None:
            self.allreduces = count_allreduces(model)
        self.batches.append(copy.deepcopy(inputs))
        return super().compute_loss(model, inputs, return_outputs, **kwargs)


class _GradientsBeforeStep(transformers.TrainerCallback):
    def __init__(self, store: list) -> None:
        self.store = store

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.store.append([p.grad.clone() for p in model.parameters()])


def arguments(folder, **overrides) -> transformers.TrainingArguments:
    options = dict(
        per_device_train_batch_size=8, max_steps=1, learning_rate=1e-3, max_grad_norm=0.0, use_cpu=True,
        remove_unused_columns=False, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    return transformers.TrainingArguments(str(folder), **{**options, **overrides})


def train(folder, **overrides) -> Recording:
    image, text, loss = build_towers()
    trainer = Recording(
        CachedLoss([image, text], loss, chunk_size=CHUNK), arguments(folder, **overrides),
        input_names=("image", "text"), train_dataset=Pairs(16), data_collator=collate,
    )
    trainer.train()
    return trainer


def test_one_step_equals_full_batch(tmp_path):
    trainer = train(tmp_path)
    assert_same_grads(trainer.grads[0], reference_grads(trainer.batches[:1]))


def test_accumulation_over_two_micro_steps_is_the_mean_of_two_full_batch_steps(tmp_path):
    trainer = train(tmp_path, gradient_accumulation_steps=2)
    assert len(trainer.grads) == 1
    assert_same_grads(trainer.grads[0], reference_grads(trainer.batches[:2]))


def test_bf16_runs_both_passes_under_autocast_and_matches_full_batch_in_bf16(tmp_path):
    seen = []
    image, text, loss = build_towers()
    image[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    trainer = Recording(
        CachedLoss([image, text], loss, chunk_size=CHUNK), arguments(tmp_path, bf16=True),
        input_names=("image", "text"), train_dataset=Pairs(16), data_collator=collate,
    )
    trainer.train()
    assert seen == [torch.bfloat16] * 6  # 3 chunks in pass (1), 3 in pass (3)
    assert_same_grads(trainer.grads[0], reference_grads(trainer.batches[:1], torch.bfloat16), rel=2e-2)


def test_refuses_what_cannot_work_before_training(tmp_path):
    cached = CachedLoss(list(build_towers()[:2]), build_towers()[2], chunk_size=CHUNK)
    with pytest.raises(ValueError, match="ddp_find_unused_parameters=False"):
        GradCacheTrainer(cached, arguments(tmp_path, ddp_find_unused_parameters=True))
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        GradCacheTrainer(cached, arguments(tmp_path, remove_unused_columns=True))
    with pytest.raises(TypeError, match="gradcache.CachedLoss"):
        GradCacheTrainer(nn.Linear(2, 2), arguments(tmp_path))
    with pytest.raises(TypeError, match="input_names"):
        GradCacheTrainer(cached, arguments(tmp_path), input_names="image")
    trainer = GradCacheTrainer(cached, arguments(tmp_path), input_names=("image", "text"))
    batch = collate([Pairs(4)[i] for i in range(4)])
    with pytest.raises(ValueError, match="no entry \\['text'\\]"):
        trainer.compute_loss(cached, {"image": batch["image"]})
    with pytest.raises(TypeError, match="DataParallel"):  # a wrapper GradCache cannot run in: an error, no hang
        trainer.compute_loss(nn.DataParallel(cached), batch)


def ddp_worker(rank: int, world_size: int, folder: str) -> dict:
    """The Trainer as torchrun starts it: the environment of each rank, its own DDP wrapper."""
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # a forked rank must not inherit the parent's single-process state
    trainer = train(os.path.join(folder, str(rank)), per_device_train_batch_size=4)
    batch = trainer.batches[0]
    refused = None
    try:  # the same check on every rank, before any collective: both raise, none waits
        trainer.compute_loss(DistributedDataParallel(trainer.model, find_unused_parameters=True), batch)
    except ValueError as error:
        refused = str(error)
    AcceleratorState._reset_state(True)
    accumulated = train(os.path.join(folder, f"accumulated{rank}"), per_device_train_batch_size=4,
                        gradient_accumulation_steps=2)
    return {
        "wrapper": type(trainer.model_wrapped).__name__, "batch": batch, "grads": trainer.grads[0],
        "allreduces": len(trainer.allreduces), "ordinary": ordinary_step_allreduces(batch), "refused": refused,
        "micro_batches": accumulated.batches[:2], "accumulated_grads": accumulated.grads[0],
        "accumulated_allreduces": len(accumulated.allreduces),
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_on_ranks(ddp_worker, 2, str(tmp_path_factory.mktemp("ddp")))


@pytest.mark.slow
def test_ddp_under_torchrun_environment_is_exact_with_one_synchronisation(ranks):
    want = reference_grads([concatenated([r["batch"] for r in ranks])])
    for r in ranks:
        assert r["wrapper"] == "DistributedDataParallel"
        assert_same_grads(r["grads"], want)
        assert r["allreduces"] == r["ordinary"] >= 1
        assert "find_unused_parameters=False" in r["refused"]


@pytest.mark.slow
def test_ddp_with_accumulation_synchronises_once_per_optimizer_step(ranks):
    """The Trainer's no_sync on the first of two micro-batches: one all-reduce in all, and the mean of FullBatch
    over the two global micro-batches (micro-batch k of every rank)."""
    want = reference_grads([concatenated([r["micro_batches"][k] for r in ranks]) for k in range(2)])
    for r in ranks:
        assert_same_grads(r["accumulated_grads"], want)
        assert r["accumulated_allreduces"] == r["ordinary"]
