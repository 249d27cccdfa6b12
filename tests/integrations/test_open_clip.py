"""build_open_clip on open_clip's smallest architecture, built without weights: GradCache over its two towers
equals FullBatch on every parameter, the temperature included; a local checkpoint loads; nothing downloads."""
from __future__ import annotations

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from PIL import Image  # noqa: E402

from gradcache import FullBatch, GradCache  # noqa: E402
from gradcache.integrations.open_clip import build_open_clip  # noqa: E402
from tests.conftest import assert_grads_close, grads_of  # noqa: E402

SMALLEST = "ViT-S-32-alt"  # the fewest parameters among open_clip's configs with its own towers (about 40M)
SIZE = 64  # 2 x 2 patches instead of 7 x 7: the same architecture, a few seconds a step on a loaded CPU


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    return build_open_clip(SMALLEST, image_size=SIZE)


def batch(parts, n: int = 2):
    g = torch.Generator().manual_seed(1)
    images = [Image.fromarray((torch.rand(40, 60, 3, generator=g) * 255).byte().numpy()) for _ in range(n)]
    pixels = torch.stack([parts.preprocess_val(image) for image in images])  # (n, 3, SIZE, SIZE)
    tokens = parts.tokenizer([f"a photo of thing number {i}" for i in range(n)])  # (n, 77)
    return pixels, tokens


def test_towers_share_no_parameter(parts):
    image_ids = {id(p) for p in parts.image_tower.parameters()}
    text_ids = {id(p) for p in parts.text_tower.parameters()}
    assert image_ids and text_ids and not image_ids & text_ids
    pixels, tokens = batch(parts)
    assert pixels.shape == (2, 3, SIZE, SIZE) and tokens.shape == (2, 77) and tokens.dtype == torch.long
    assert parts.loss_fn.logit_scale.exp().item() == pytest.approx(1 / 0.07, rel=1e-5)  # open_clip's init


def test_gradcache_over_the_towers_equals_full_batch(parts):
    pixels, tokens = batch(parts)
    modules = (parts.image_tower, parts.text_tower, parts.loss_fn)
    for m in modules:
        m.eval()  # no dropout in these configs; eval keeps any future one out of the comparison
        m.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert parts.image_tower(pixels).shape == parts.text_tower(tokens).shape == (2, 256)  # one embedding space
    want_loss = FullBatch([parts.image_tower, parts.text_tower], parts.loss_fn).step(pixels, tokens)
    want = grads_of(*modules)
    for m in modules:
        m.zero_grad(set_to_none=True)
    got_loss = GradCache([parts.image_tower, parts.text_tower], parts.loss_fn, chunk_size=1).step(pixels, tokens)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_grads_close(grads_of(*modules), want, 1e-4)


@pytest.mark.slow
def test_a_local_checkpoint_is_loaded_and_bad_names_are_refused(tmp_path):
    torch.manual_seed(2)
    model = open_clip.create_model(SMALLEST, pretrained=None, force_image_size=SIZE)
    with torch.no_grad():
        model.logit_scale.fill_(3.0)
    path = tmp_path / "checkpoint.pt"
    torch.save(model.state_dict(), path)
    parts = build_open_clip(SMALLEST, pretrained=path, image_size=SIZE)
    assert torch.equal(parts.image_tower.conv1.weight, model.visual.conv1.weight)
    assert torch.equal(parts.text_tower.model.token_embedding.weight, model.token_embedding.weight)
    assert parts.loss_fn.logit_scale.item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="not a file"):
        build_open_clip(SMALLEST, pretrained="openai")
    with pytest.raises(ValueError, match="not an open_clip architecture"):
        build_open_clip("ViT-Tiny-Nonexistent")
    with pytest.raises(ValueError, match="image_size must be"):
        build_open_clip(SMALLEST, image_size=0)
    with pytest.raises(ValueError, match="Hugging Face hub"):
        build_open_clip("roberta-ViT-B-32")


def test_a_siglip_architecture_gets_the_sigmoid_loss_at_its_bias():
    from gradcache.integrations.open_clip import is_siglip, open_clip_loss
    from gradcache.losses import ClipLoss, SigLipLoss
    from tests.tiny_open_clip import TINY_SIGLIP_BIAS, register_tiny_siglip

    siglip = register_tiny_siglip()
    torch.manual_seed(0)
    parts = build_open_clip(siglip, image_size=32)
    assert is_siglip(siglip) and not is_siglip(SMALLEST)
    assert isinstance(parts.loss_fn, SigLipLoss) and parts.loss_fn.bias.item() == TINY_SIGLIP_BIAS
    assert parts.loss_fn.bias.requires_grad and parts.loss_fn.logit_scale.requires_grad
    loss = open_clip_loss(siglip, temperature=0.1, bias=-2.0, queue_size=8)
    assert isinstance(loss, SigLipLoss) and loss.bias.item() == -2.0 and loss.queue_size == 8
    assert isinstance(open_clip_loss(SMALLEST, temperature=0.1), ClipLoss)
    with pytest.raises(ValueError, match="no init_logit_bias"):
        open_clip_loss(SMALLEST, temperature=0.1, bias=-2.0)
