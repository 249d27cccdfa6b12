"""The models as GradCache encoders: chunked, checkpointed and padding-trimmed steps give full-batch gradients."""

import copy

import torch

from gradcache import FullBatch, GradCache, losses
from gradcache.models import CLIP, ByteTokenizer, ConvNet, ProjectionHead, SimCLRModel, TextEncoder, ViTEncoder

TOKENIZER = ByteTokenizer(context_length=24)
CAPTIONS = ["a red bus", "cat", "two dogs playing in the snow", "ok", "a bowl of soup", "sky"]


def _gradients(module: torch.nn.Module) -> list[torch.Tensor]:
    return [parameter.grad.clone() for parameter in module.parameters()]


def test_simclr_with_checkpointing_under_gradcache_matches_full_batch():
    torch.manual_seed(0)
    backbone = ConvNet(width=8, groups=4)  # GroupNorm: per-example, so chunking is exact
    reference = SimCLRModel(backbone, ProjectionHead(backbone.out_dim, hidden_dim=16, out_dim=8))
    cached = copy.deepcopy(reference)
    cached.set_grad_checkpointing(True)
    view1, view2 = torch.randn(6, 3, 16, 16), torch.randn(6, 3, 16, 16)

    full_loss = FullBatch(reference, losses.NTXent(temperature=0.5)).step(view1, view2)
    cached_loss = GradCache(cached, losses.NTXent(temperature=0.5), chunk_size=4).step(view1, view2)

    torch.testing.assert_close(cached_loss, full_loss)
    for cached_grad, full_grad in zip(_gradients(cached), _gradients(reference)):
        torch.testing.assert_close(cached_grad, full_grad, rtol=1e-4, atol=1e-6)


def test_clip_towers_with_trimmed_padding_and_checkpointing_match_full_batch():
    torch.manual_seed(0)
    reference = CLIP(
        ViTEncoder(image_size=16, patch_size=8, width=16, layers=1, heads=2),
        TextEncoder(TOKENIZER.vocab_size, context_length=24, width=16, layers=2, heads=2, pooling="eos"),
        embed_dim=8,
    )
    cached = copy.deepcopy(reference)
    cached.set_grad_checkpointing(True)
    images, texts = torch.randn(len(CAPTIONS), 3, 16, 16), TOKENIZER(CAPTIONS)
    reference_loss_fn = losses.ClipLoss(temperature=0.1)
    cached_loss_fn = copy.deepcopy(reference_loss_fn)

    full_loss = FullBatch([reference.image_tower, reference.text_tower], reference_loss_fn).step(images, texts)
    # Chunks of 2: most text chunks end in padding columns that trim_padding drops.
    strategy = GradCache([cached.image_tower, cached.text_tower], cached_loss_fn, chunk_size=2, trim_padding=True)
    cached_loss = strategy.step(images, texts)

    torch.testing.assert_close(cached_loss, full_loss)
    for cached_grad, full_grad in zip(_gradients(cached), _gradients(reference)):
        torch.testing.assert_close(cached_grad, full_grad, rtol=1e-4, atol=1e-6)
    for cached_grad, full_grad in zip(_gradients(cached_loss_fn), _gradients(reference_loss_fn)):
        torch.testing.assert_close(cached_grad, full_grad, rtol=1e-4, atol=1e-6)
