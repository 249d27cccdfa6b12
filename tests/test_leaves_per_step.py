"""Phase (3)'s hook-free backward of a plain encoder's chunks finds the leaves it writes into without a Python walk
of each chunk's autograd graph: the walk runs once per input per step, whatever the number of chunks, and the
gradients stay those of the full batch where an input of a shared encoder requires grad, where only a later input
does, and where a leaf sits outside the encoder (a `get_embedding` head, a tensor the forward closes over)."""
from __future__ import annotations

from unittest import mock

import torch
from torch import nn

import gradcache.cache
import gradcache.distributed
from gradcache import FullBatch, GradCache
from gradcache.losses import InfoNCE

BATCH = 16


def _walks(chunk_size: int) -> int:
    """Calls of the graph walk in one GradCache step of a two-input step through one shared encoder."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
    queries, passages = torch.randn(BATCH, 6), torch.randn(BATCH, 6)
    walk, calls = gradcache.distributed.graph_leaves, []

    def counted(outputs):
        calls.append(len(outputs))
        return walk(outputs)

    with mock.patch.object(gradcache.distributed, "graph_leaves", counted), \
            mock.patch.object(gradcache.cache, "graph_leaves", counted):
        GradCache(encoder, InfoNCE(), chunk_size).step(queries, passages)
    return len(calls)


def test_the_graph_walk_does_not_run_per_chunk():
    assert _walks(BATCH // 2) == _walks(BATCH // 8)


def _step_grads(strategy, encoder, head, scale, queries, passages):
    tensors = [*encoder.parameters(), *head.parameters(), scale, passages]
    for tensor in tensors:
        tensor.grad = None
    loss = strategy.step(queries, passages)
    return loss, [t.grad.clone() for t in tensors]


def test_leaves_of_a_later_input_and_outside_the_encoder_get_the_full_batch_gradient():
    """One encoder for both inputs; only the second input requires grad (the first input's chunks reach none of
    its leaves); `get_embedding` is a head with parameters and the forward closes over a tensor requiring grad."""
    torch.manual_seed(1)
    scale = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(6, 8)

        def forward(self, x):
            return torch.tanh(self.linear(x)) * scale

    encoder, head = Scaled().double(), nn.Linear(8, 4).double()
    queries = torch.randn(BATCH, 6, dtype=torch.float64)
    passages = torch.randn(BATCH, 6, dtype=torch.float64, requires_grad=True)
    full = FullBatch(encoder, InfoNCE(), get_embedding=head)
    want_loss, want = _step_grads(full, encoder, head, scale, queries, passages)
    for chunk_size in (4, 2):
        strategy = GradCache(encoder, InfoNCE(), chunk_size, get_embedding=head)
        got_loss, got = _step_grads(strategy, encoder, head, scale, queries, passages)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=1e-12)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
