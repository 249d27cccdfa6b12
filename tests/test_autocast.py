"""Mixed precision: encoders under autocast, the loss and cached gradients in float32, and the second pass
under the first pass's autocast state even when backward() is called outside it."""
from __future__ import annotations

import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import NTXent
from tests.conftest import assert_grads_close, grads_of, zero


class Recording(nn.Module):
    """Records the autocast state and output dtype of every forward."""

    def __init__(self):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(10, 32), nn.Linear(32, 6)
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x):
        out = self.linear2(torch.relu(self.linear1(x)))
        self.seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        return out


def test_second_pass_reenters_the_callers_autocast_when_backward_is_outside():
    torch.manual_seed(0)
    encoder, loss = Recording(), NTXent()
    views = tuple(torch.randn(2, 8, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = CachedLoss(encoder, loss, 4)(*views)
    first_pass = list(encoder.seen)
    encoder.seen.clear()
    assert value.dtype == torch.float32  # the loss is computed in float32 on upcast embeddings
    value.backward()  # outside the autocast block, as training loops do
    assert first_pass == [(True, torch.bfloat16)] * 4
    assert encoder.seen == [(True, torch.bfloat16)] * 4


def test_second_pass_leaves_autocast_off_when_first_pass_had_it_off():
    encoder, loss = Recording(), NTXent()
    views = tuple(torch.randn(2, 8, 10))
    value = CachedLoss(encoder, loss, 4)(*views)
    encoder.seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value.backward()
    assert encoder.seen == [(False, torch.float32)] * 4


def test_autocast_dtype_option_matches_full_batch_under_the_same_autocast():
    torch.manual_seed(1)
    encoder, loss = Recording(), NTXent()
    views = tuple(torch.randn(2, 12, 10))
    zero(encoder)
    want_loss = FullBatch(encoder, loss, autocast_dtype=torch.bfloat16).step(*views)
    want = grads_of(encoder)
    zero(encoder)
    encoder.seen.clear()
    got_loss = GradCache(encoder, loss, 4, autocast_dtype=torch.bfloat16).step(*views)
    assert set(encoder.seen) == {(True, torch.bfloat16)}
    assert got_loss.dtype == torch.float32
    # bf16 rounding differs with the matmul shapes: loose, but far tighter than a wrong gradient
    assert torch.allclose(got_loss, want_loss, rtol=2e-2)
    assert_grads_close(grads_of(encoder), want, 5e-2)


class OffloadedShards(nn.Module):
    """Parameters as FSDP2 with CPU offload holds them: DTensor shards on the CPU whose mesh computes on CUDA."""

    def parameters(self, recurse: bool = True):
        mesh = type("Mesh", (), {"device_type": "cuda"})()
        return iter([type("Shard", (), {"device": torch.device("cpu"), "device_mesh": mesh})()])


def test_autocast_names_the_device_an_offloaded_shard_computes_on():
    """FSDP2's --cpu-offload keeps the shards on the CPU: autocast on the CPU would leave the GPU forward in fp32
    (issue 39 item 4). The device type comes from the shard's mesh; a plain parameter's from its own device."""
    made = [GradCache(OffloadedShards(), NTXent(), 2, autocast_dtype=torch.bfloat16),
            FullBatch(OffloadedShards(), NTXent(), autocast_dtype=torch.bfloat16)]
    assert [strategy.device_type() for strategy in made] == ["cuda", "cuda"]
    assert GradCache(nn.Linear(2, 2), NTXent(), 2).device_type() == "cpu"
