"""What the trainer tests share: a two-tower model with a learnable temperature, its data, and the reference
gradients of FullBatch on the batches a trainer actually drew."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from gradcache import FullBatch
from gradcache.distributed import all_gather_with_grad
from gradcache.losses import ClipLoss
from tests.conftest import TokenEncoder, mlp, tokens

CHUNK = 3  # uneven last chunks at batch 8 and 4


def build_towers() -> tuple[nn.Module, nn.Module, ClipLoss]:
    """An image MLP, a token tower (dropout off: trainers call .train()), and CLIP's learnable temperature."""
    torch.manual_seed(0)
    text = TokenEncoder()
    text.dropout.p = 0.0
    return mlp(), text, ClipLoss(temperature=0.1, learnable=True)


class Pairs(torch.utils.data.Dataset):
    """(image, tokens) pairs; rows come back as flat dicts of tensors."""

    def __init__(self, n: int = 16, seed: int = 5) -> None:
        g = torch.Generator().manual_seed(seed)
        self.image, self.text = torch.randn(n, 10, generator=g), tokens(n, seed=seed + 1)

    def __len__(self) -> int:
        return self.image.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.image[i], **{k: v[i] for k, v in self.text.items()}}


def collate(rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, object]:
    """{"image": (B, 10), "text": {"input_ids", "attention_mask"}}: one entry per encoder."""
    stacked = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    return {"image": stacked["image"], "text": {k: stacked[k] for k in ("input_ids", "attention_mask")}}


def concatenated(batches: Sequence[dict]) -> dict:
    """Batches of several ranks as one batch, rows in rank order."""
    return {
        "image": torch.cat([b["image"] for b in batches]),
        "text": {k: torch.cat([b["text"][k] for b in batches]) for k in ("input_ids", "attention_mask")},
    }


def reference_grads(
    batches: Sequence[dict], autocast_dtype: torch.dtype | None = None, clip: float | None = None
) -> list[torch.Tensor]:
    """FullBatch on each batch, gradients averaged over the batches (accumulation), optionally clipped: the
    gradient of every parameter (encoders, then the temperature) a trainer's optimizer step should see."""
    image, text, loss = build_towers()
    for batch in batches:
        FullBatch([image, text], loss, autocast_dtype=autocast_dtype).step(batch["image"], batch["text"])
    parameters = [*image.parameters(), *text.parameters(), *loss.parameters()]
    for p in parameters:
        p.grad /= len(batches)
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(parameters, clip)
    return [p.grad for p in parameters]


def assert_same_grads(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], rel: float = 1e-5) -> None:
    """Every parameter's gradient within `rel` of the largest entry; the temperature's within rel of its own."""
    assert len(got) == len(want)
    scale = max(w.abs().max().item() for w in want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None, f"parameter {i} has no gradient"
        error = (g - w).abs().max().item()
        assert error <= rel * scale, f"parameter {i}: max error {error:.3g} vs scale {scale:.3g}"
    temperature_got, temperature_want = got[-1], want[-1]  # logit_scale: its own gradient, not world_size times it
    assert torch.allclose(temperature_got, temperature_want, rtol=max(rel * 10, 1e-4), atol=1e-7)


class Ordinary(nn.Module):
    """The towers and the loss as one module computing the full-batch loss in one forward: what one ordinary
    DDP step of this model communicates is counted on it."""

    def __init__(self, image: nn.Module, text: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.image, self.text, self.loss = image, text, loss

    def forward(self, image: torch.Tensor, text: dict) -> torch.Tensor:
        return self.loss(all_gather_with_grad(self.image(image)), all_gather_with_grad(self.text(**text)))


def count_allreduces(ddp: nn.Module) -> list[int]:
    """Register a comm hook on a DDP module that records one entry per bucket all-reduce."""
    calls: list[int] = []

    def hook(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, hook)
    return calls


def ordinary_step_allreduces(batch: dict) -> int:
    """All-reduce calls of one ordinary DDP forward and backward of the whole model on this rank's batch."""
    model = DistributedDataParallel(Ordinary(*build_towers()))
    calls = count_allreduces(model)
    model(batch["image"], batch["text"]).backward()
    return len(calls)
