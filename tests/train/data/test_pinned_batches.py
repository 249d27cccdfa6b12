"""Batches bound for a CUDA device: the loaders pin them (with torch.cuda mocked as initialised) and the run moves
each batch with non_blocking=True; on a CPU run nothing is pinned."""
from __future__ import annotations

from unittest import mock

import torch

from gradcache.train.data.order import StepSampler, step_loader
from gradcache.train.data.streams import stream_loader
from gradcache.train.run import _to_device


def loaders():
    sampler = StepSampler(8, 4, 0, 0, 2, 0, 1)
    rows = list(range(8))
    return step_loader(rows, sampler, torch.tensor, 0), stream_loader(mock.Mock(seed=0), 0)


def test_the_loaders_pin_only_for_cuda():
    with mock.patch("torch.cuda.is_initialized", return_value=True):
        assert all(loader.pin_memory for loader in loaders())
    with mock.patch("torch.cuda.is_initialized", return_value=False):
        assert not any(loader.pin_memory for loader in loaders())


def test_a_batch_moves_without_blocking_the_host():
    calls = []

    class Moved(torch.Tensor):
        def to(self, *args, **kwargs):
            calls.append(kwargs.get("non_blocking"))
            return torch.Tensor.to(torch.Tensor(self), *args, **kwargs)

    batch = torch.arange(3.0).as_subclass(Moved)
    _to_device(batch, torch.device("cpu"))
    _to_device({"input_ids": batch, "attention_mask": batch}, torch.device("cpu"))
    assert calls == [True, True, True]
