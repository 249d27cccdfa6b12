"""GradCacheLoss inside SentenceTransformerTrainer: one step (accumulated, bf16, and under DDP on two gloo
ranks) against the same trainer with sentence-transformers' MultipleNegativesRankingLoss on the same batches."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments  # noqa: E402
from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    MatryoshkaLoss, MultipleNegativesRankingLoss,
)
from transformers import TrainerCallback  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheLoss  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402
from tests.integrations.sentence_models import COLUMNS, save_tiny_bert, tiny_sentence_transformer  # noqa: E402
from tests.integrations.towers import count_allreduces  # noqa: E402
from tests.multiprocess import run_on_ranks  # noqa: E402


class _GradientsBeforeStep(TrainerCallback):
    def __init__(self) -> None:
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


class Recording(SentenceTransformerTrainer):
    """Keeps the batches and, under DDP, counts the wrapper's all-reduces."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not hasattr(self, "batches"):
            self.batches, self.allreduces = [], None
            if isinstance(model, DistributedDataParallel):
                self.allreduces = count_allreduces(model)
        self.batches.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def train(folder, ours: bool, gather: bool = False, matryoshka: bool = False,
          **overrides) -> tuple[Recording, _GradientsBeforeStep]:
    model = tiny_sentence_transformer(os.path.join(folder, "bert"))
    loss = (GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=2, gather_across_devices=gather) if ours
            else MultipleNegativesRankingLoss(model, scale=20.0, gather_across_devices=gather))
    if matryoshka:
        loss = MatryoshkaLoss(model, loss, [32, 16, 8], [1.0, 0.5, 2.0])
    options = dict(per_device_train_batch_size=5, max_steps=1, learning_rate=1e-3, max_grad_norm=0.0, use_cpu=True,
                   report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=3)
    args = SentenceTransformerTrainingArguments(os.path.join(folder, "ours" if ours else "mnrl"), **{**options, **overrides})
    grab = _GradientsBeforeStep()
    data = datasets.Dataset.from_dict(copy.deepcopy(COLUMNS))
    trainer = Recording(model=model, args=args, train_dataset=data, loss=loss, callbacks=[grab])
    trainer.train()
    return trainer, grab


def assert_close(got: dict, want: dict, rel: float) -> None:
    assert got.keys() == want.keys() and want
    scale = max(w.abs().max().item() for w in want.values())
    for name in want:
        error = (got[name] - want[name]).abs().max().item()
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


def same_batches(a: Recording, b: Recording) -> bool:
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a.batches, b.batches))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("st-trainer")
    save_tiny_bert(folder / "bert")
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize("options, rel", [
    ({}, 1e-5),
    # each micro-batch its own negatives, as MNRL's
    pytest.param({"gradient_accumulation_steps": 2}, 1e-5, marks=pytest.mark.slow),
    pytest.param({"bf16": True}, 2e-2, marks=pytest.mark.slow),
    # MatryoshkaLoss around each loss
    pytest.param({"matryoshka": True, "gradient_accumulation_steps": 2}, 1e-5, marks=pytest.mark.slow),
], ids=["one-step", "accumulation", "bf16", "matryoshka"])
def test_a_trainer_step_equals_multiple_negatives_ranking_loss(folder, options, rel):
    ours, ours_grads = train(folder, ours=True, **options)
    theirs, their_grads = train(folder, ours=False, **options)
    assert same_batches(ours, theirs) and len(ours_grads.grads) == 1
    assert_close(ours_grads.grads[0], their_grads.grads[0], rel)


def ddp_worker(rank: int, world_size: int, folder: str) -> dict:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    from accelerate.state import AcceleratorState

    results = {}
    for name, ours in (("ours", True), ("theirs", False)):
        AcceleratorState._reset_state(True)
        trainer, grab = train(folder, ours=ours, gather=True, per_device_train_batch_size=4)
        results[name] = {"grads": grab.grads[0], "allreduces": len(trainer.allreduces),
                         "wrapper": type(trainer.model_wrapped).__name__, "batches": trainer.batches}
    return results


@pytest.mark.slow
def test_ddp_equals_multiple_negatives_ranking_loss_gathered_with_as_many_allreduces(folder):
    """Two ranks: MNRL with gather_across_devices is the global-batch loss, as GradCacheLoss's gather is."""
    for rank in run_on_ranks(ddp_worker, 2, folder):
        ours, theirs = rank["ours"], rank["theirs"]
        assert ours["wrapper"] == "DistributedDataParallel"
        assert all(torch.equal(ours["batches"][0][k], theirs["batches"][0][k]) for k in ours["batches"][0])
        assert_close(ours["grads"], theirs["grads"], 1e-5)
        assert ours["allreduces"] == theirs["allreduces"] >= 1
