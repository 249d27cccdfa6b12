"""Batches bound for a CUDA device: the loaders pin them (with torch.cuda mocked as initialised) and the run moves
each batch with non_blocking=True, uint8 images as bytes normalised after the move; on a CPU run nothing is
pinned."""
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


def test_uint8_images_cross_as_bytes_and_are_normalised_after_the_move():
    """clip's caption batches hold uint8 images: the copy moves bytes (a quarter of float32's) and the model sees
    the same [-1, 1] floats the host used to make, computed after the move."""
    moved = []

    class Moved(torch.Tensor):
        def to(self, *args, **kwargs):
            moved.append(self.dtype)
            return torch.Tensor.to(torch.Tensor(self), *args, **kwargs)

    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    got = _to_device(images.as_subclass(Moved), torch.device("cpu"))
    assert moved == [torch.uint8]
    assert got.dtype == torch.float32 and torch.equal(got, (images.float() / 255.0 - 0.5) / 0.5)
