"""BatchNorm running statistics advance once per chunk (first pass only), in every strategy."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import gradcache.batchnorm
from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import NTXent


class BNEncoder(nn.Module):
    def __init__(self, checkpointed: bool = False):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.out = nn.Linear(8, 4)
        self.checkpointed = checkpointed

    def forward(self, x):
        if self.checkpointed:
            hidden = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        else:
            hidden = self.block(x)
        return self.out(hidden)


def buffers(module):
    return {k: v.clone() for k, v in module.named_buffers()}


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("strategy", ["gradcache", "cached", "naive", "full"])
def test_running_stats_are_those_of_one_chunked_forward(strategy, checkpointed):
    torch.manual_seed(0)
    encoder = BNEncoder(checkpointed).train()
    reference = copy.deepcopy(encoder)
    views = tuple(torch.randn(2, 10, 6))
    chunk = 10 if strategy == "full" else 4
    with torch.no_grad():  # one chunked train-mode forward, in the strategies' order
        order = [views[0], views[1]] if strategy != "naive" else None
        if strategy == "naive":  # micro-batch k takes chunk k of every input
            for a, b in zip(views[0].split(chunk), views[1].split(chunk)):
                reference(a), reference(b)
        else:
            for view in order:
                for c in view.split(chunk):
                    reference(c)
    loss = NTXent()
    if strategy == "gradcache":
        GradCache(encoder, loss, chunk).step(*views)
    elif strategy == "cached":
        CachedLoss(encoder, loss, chunk)(*views).backward()
    elif strategy == "naive":
        NaiveAccumulation(encoder, loss, chunk).step(*views)
    else:
        FullBatch(encoder, loss).step(*views)
    got, want = buffers(encoder), buffers(reference)
    assert int(got["block.1.num_batches_tracked"]) == int(want["block.1.num_batches_tracked"])
    for name in want:
        assert torch.allclose(got[name].double(), want[name].double(), atol=1e-6), name


def test_batchnorm_in_chunks_warns_once_and_names_the_alternatives(monkeypatch):
    monkeypatch.setattr(gradcache.batchnorm, "_warned", False)
    encoder = BNEncoder().train()
    views = tuple(torch.randn(2, 8, 6))
    with pytest.warns(UserWarning, match="GroupNorm or LayerNorm"):
        GradCache(encoder, NTXent(), 4).step(*views)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GradCache(encoder, NTXent(), 4).step(*views)  # no second warning
        GradCache(encoder.eval(), NTXent(), 4).step(*views)  # eval-mode BatchNorm: nothing to warn about
