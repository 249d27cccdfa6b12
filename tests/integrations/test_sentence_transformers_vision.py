"""sentence-transformers' multimodal models through the adapters (issue 46 item 3): a SentenceTransformer on a tiny
Qwen2-VL (Transformer with its processor, last-token Pooling, Normalize) fed text, image and image + text rows
(`modality` and `num_images_per_sample` from its preprocess), GradCacheLoss against MultipleNegativesRankingLoss
over the whole batch, value and every parameter's gradient, with no split_fn; the GIST loss with a Qwen2-VL guide
against GISTEmbedLoss; a Qwen2-VL MultiVectorEncoder against the peer's uncached multi-vector loss."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("PIL")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    GISTEmbedLoss, MultipleNegativesRankingLoss,
)

from gradcache.integrations.sentence_transformers import (  # noqa: E402
    GradCacheGISTLoss, GradCacheLoss, GradCacheMultiVectorLoss,
)
from gradcache.losses import InfoNCE  # noqa: E402
from tests.vlm_models import images, write_tiny_qwen2_vl  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return write_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"))


def vision_sentence_transformer(folder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(folder))
    return SentenceTransformer(modules=[transformer, Pooling(32, "lasttoken"), Normalize()], device="cpu")


def mixed_columns(model, rows: int = 5):
    """Anchors cycling text, image, image + text; positives texts; as the trainer's collator preprocesses them."""
    pictures = images(rows, seed=3)
    texts = ["a cat", "the red photo of a dog", "a dog sits on the mat", "blue tree", "the cat is green"]
    anchors = [[texts[k], pictures[k], {"text": texts[k], "image": pictures[k]}][k % 3] for k in range(rows)]
    positives = [f"{texts[(k + 1) % len(texts)]} photo" for k in range(rows)]
    return [model.preprocess(anchors), model.preprocess(positives)]


def loss_and_grads(model, loss, features):
    model.zero_grad(set_to_none=True)
    value = loss(copy.deepcopy(features), None)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value.detach(), grads


def assert_close(got: dict, want: dict, rel: float = 1e-5) -> None:
    assert got.keys() == want.keys()
    overall = max(w.abs().max().item() for w in want.values())
    for name, w in want.items():
        error, scale = (got[name] - w).abs().max().item(), max(w.abs().max().item(), 1e-4 * overall)
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("options", [{"chunk_size": 2}, {"chunk_size": 4, "chunk_tokens": 40}],
                         ids=["chunk2", "tokens"])
def test_gradcache_loss_on_a_qwen2_vl_sentence_transformer_equals_mnrl(qwen_folder, options):
    model = vision_sentence_transformer(qwen_folder)
    features = mixed_columns(model)
    anchors = features[0]
    assert anchors["modality"] == "message" and anchors["num_images_per_sample"].tolist() == [0, 1, 1, 0, 1]
    want_loss, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=20.0), features)
    options = dict(options)
    loss = GradCacheLoss(model, InfoNCE(temperature=0.05), options.pop("chunk_size"), **options)
    got_loss, got = loss_and_grads(model, loss, features)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


def test_gist_loss_with_a_vision_guide_equals_gist_embed_loss(qwen_folder):
    """The guide, a second Qwen2-VL SentenceTransformer with the model's processor, reads the same features."""
    model, guide = vision_sentence_transformer(qwen_folder), vision_sentence_transformer(qwen_folder)
    with torch.no_grad():
        for p in guide.parameters():
            p.mul_(0.9)  # another model than the trained one
    features = mixed_columns(model)
    want_loss, want = loss_and_grads(model, GISTEmbedLoss(model, guide, temperature=0.05), features)
    got_loss, got = loss_and_grads(model, GradCacheGISTLoss(model, guide, temperature=0.05, chunk_size=2), features)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


def test_multi_vector_loss_on_a_qwen2_vl_multi_vector_encoder_equals_the_peers_loss(qwen_folder):
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.losses.merged_forward import column_merging_disabled
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    torch.manual_seed(0)  # the Dense projection is initialised at random
    model = MultiVectorEncoder(str(qwen_folder), device="cpu")  # Transformer, Dense, MultiVectorMask, Normalize
    anchors, positives = mixed_columns(model)
    features = [{**anchors, "task": "query"}, {**positives, "task": "document"}]
    assert features[0]["num_images_per_sample"].sum() > 0
    with column_merging_disabled():  # one forward per column, as GradCache encodes them
        want_loss, want = loss_and_grads(model, MultiVectorMultipleNegativesRankingLoss(model), features)
    got_loss, got = loss_and_grads(model, GradCacheMultiVectorLoss(model, chunk_size=2), features)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)
