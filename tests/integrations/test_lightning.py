"""GradCacheModule: one Lightning optimizer step (accumulated and clipped, bf16-mixed, under Lightning's DDP
strategy on two gloo ranks) against FullBatch on the batches Lightning drew, on every parameter, the
learnable temperature included."""
from __future__ import annotations

import os

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from gradcache.integrations.lightning import GradCacheModule  # noqa: E402
from tests.integrations.towers import (  # noqa: E402
    CHUNK, Pairs, assert_same_grads, build_towers, collate, concatenated, count_allreduces, ordinary_step_allreduces,
    reference_grads,
)
from tests.multiprocess import run_on_ranks  # noqa: E402


class Recording(GradCacheModule):
    """Keeps every batch of training_step and the gradients after Lightning's clipping, before each step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches, self.grads, self.allreduces = [], [], None

    def on_train_start(self) -> None:  # Lightning registers a comm hook on CUDA only: count on CPU ourselves
        if isinstance(self.trainer.strategy.model, DistributedDataParallel):
            self.allreduces = count_allreduces(self.trainer.strategy.model)

    def training_step(self, batch, batch_idx):
        self.batches.append(batch)
        return super().training_step(batch, batch_idx)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.grads.append([p.grad.clone() for p in self.parameters()])


def fit(batch_size: int = 8, module: GradCacheModule | None = None, **trainer_options) -> Recording:
    if module is None:
        image, text, loss = build_towers()
        module = Recording([image, text], loss, CHUNK, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    loader = torch.utils.data.DataLoader(Pairs(16), batch_size=batch_size, collate_fn=collate)
    options = dict(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
    pl.Trainer(**{**options, **trainer_options}).fit(module, loader)
    return module


def test_one_step_equals_full_batch():
    module = fit()
    assert_same_grads(module.grads[0], reference_grads(module.batches[:1]))


def test_accumulation_and_clipping_in_lightnings_own_way_are_exact():
    module = fit(accumulate_grad_batches=2, gradient_clip_val=0.5)
    assert len(module.grads) == 1
    want = reference_grads(module.batches[:2], clip=0.5)
    assert torch.cat([w.flatten() for w in want]).norm() == pytest.approx(0.5, rel=1e-4)  # the clip did bite
    assert_same_grads(module.grads[0], want)


def test_bf16_mixed_runs_both_passes_under_autocast_and_matches_full_batch_in_bf16():
    image, text, loss = build_towers()
    seen = []
    image[0].register_forward_hook(lambda m, args, output: seen.append(output.dtype))
    module = Recording([image, text], loss, CHUNK, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    fit(module=module, precision="bf16-mixed")
    assert seen == [torch.bfloat16] * 6  # 3 chunks in pass (1), 3 in pass (3)
    assert_same_grads(module.grads[0], reference_grads(module.batches[:1], torch.bfloat16), rel=2e-2)


def test_a_temperature_is_clamped_after_every_optimizer_step():
    image, text, loss = build_towers()
    with torch.no_grad():
        loss.logit_scale.fill_(10.0)  # far above log(100): the first step must bring it back
    fit(module=GradCacheModule([image, text], loss, CHUNK, optimizer=lambda p: torch.optim.SGD(p, lr=0.0)))
    assert loss.logit_scale.item() == pytest.approx(torch.log(torch.tensor(100.0)).item())


def test_without_an_optimizer_or_with_an_unknown_batch_it_says_what_to_do():
    image, text, loss = build_towers()
    module = GradCacheModule([image, text], loss, CHUNK)
    with pytest.raises(TypeError, match="optimizer=lambda params"):
        module.configure_optimizers()
    with pytest.raises(TypeError, match="override inputs_of"):
        module.inputs_of(torch.zeros(2))


def ddp_worker(rank: int, world_size: int) -> dict:
    """Lightning's DDP strategy in a process group that torchrun would have started."""
    os.environ.update(TORCHELASTIC_RUN_ID="gradcache-test", LOCAL_RANK=str(rank), GROUP_RANK="0",
                      LOCAL_WORLD_SIZE=str(world_size))
    module = fit(batch_size=4, devices=world_size, strategy="ddp")
    allreduces = len(module.allreduces)
    refused = None
    try:  # the same check on every rank before the first batch: both raise, none waits
        fit(batch_size=4, devices=world_size, strategy=DDPStrategy(find_unused_parameters=True))
    except ValueError as error:
        refused = str(error)
    accumulated = fit(batch_size=4, devices=world_size, strategy="ddp", accumulate_grad_batches=2)
    return {"batch": module.batches[0], "grads": module.grads[0], "allreduces": allreduces,
            "ordinary": ordinary_step_allreduces(module.batches[0]), "refused": refused,
            "micro_batches": accumulated.batches[:2], "accumulated_grads": accumulated.grads[0],
            "accumulated_allreduces": len(accumulated.allreduces)}


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(ddp_worker, 2)


@pytest.mark.slow
def test_ddp_strategy_around_the_whole_module_is_exact_with_one_synchronisation(ranks):
    want = reference_grads([concatenated([r["batch"] for r in ranks])])
    for r in ranks:
        assert_same_grads(r["grads"], want)
        assert r["allreduces"] == r["ordinary"] >= 1
        assert "find_unused_parameters=False" in r["refused"]


@pytest.mark.slow
def test_ddp_with_accumulation_synchronises_once_per_optimizer_step(ranks):
    """Two micro-batches per step: Lightning's no_sync on the first, one all-reduce in all; the gradient is the
    mean of FullBatch over the two global micro-batches (micro-batch k of every rank)."""
    want = reference_grads([concatenated([r["micro_batches"][k] for r in ranks]) for k in range(2)])
    for r in ranks:
        assert_same_grads(r["accumulated_grads"], want)
        assert r["accumulated_allreduces"] == r["ordinary"]
