"""`reuse_outputs` through sentence-transformers' adapter: GradCacheLoss on a tiny Qwen2-VL SentenceTransformer
(Transformer with its processor, last-token Pooling, Normalize), the vision tower frozen and named as
`model[0].model.visual`, computes the tower in phase (1) only and gives MultipleNegativesRankingLoss's gradients
over the whole batch."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("PIL")

from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheLoss  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402
from tests.integrations.test_sentence_transformers_vision import (  # noqa: E402
    assert_close, loss_and_grads, mixed_columns, qwen_folder, vision_sentence_transformer,
)

__all__ = ["qwen_folder"]  # the fixture this module uses
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.slow  # about 3 s on 2 idle cores: three passes over a Qwen2-VL SentenceTransformer
def test_gradcache_loss_reuses_a_frozen_tower_and_equals_mnrl(qwen_folder):
    model = vision_sentence_transformer(qwen_folder)
    tower = model[0].model.visual
    tower.requires_grad_(False)
    calls = []
    tower.patch_embed.register_forward_pre_hook(lambda module, args: calls.append(1))  # the tower computes
    features = mixed_columns(model)
    want_loss, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=20.0), features)
    calls.clear()
    loss = GradCacheLoss(model, InfoNCE(temperature=0.05), 2, reuse_outputs=[tower])
    got_loss, got = loss_and_grads(model, loss, features)
    images = features[0]["num_images_per_sample"].tolist()  # the positives are text
    assert len(calls) == sum(any(images[k:k + 2]) for k in range(0, len(images), 2)) > 0  # phase (1) alone
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)
    assert not any(name.startswith("0.model.visual") for name in got)


@pytest.mark.slow  # the folder's writing costs 2 s
def test_a_trainable_tower_is_refused_by_the_adapter(qwen_folder):
    model = vision_sentence_transformer(qwen_folder)
    with pytest.raises(ValueError, match=r"reuse_outputs\[0\] \(Qwen2VisionTransformerPretrainedModel\) has a parameter"):
        GradCacheLoss(model, InfoNCE(temperature=0.05), 2, reuse_outputs=[model[0].model.visual])
