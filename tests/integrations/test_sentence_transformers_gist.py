"""GradCacheGISTLoss against sentence-transformers' own GISTEmbedLoss on the same model and guide: value and
gradient of every parameter, both margin strategies, a guide of another width (and, on MiniLM, another max length,
so both retokenize), the guide encoded once per chunk without a gradient, and bad input refused before any forward."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss, MatryoshkaLoss  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheGISTLoss  # noqa: E402
from tests.integrations.sentence_models import (  # noqa: E402
    assert_close, features, minilm_path, save_tiny_bert, tiny_sentence_transformer,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    model = save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    guide = save_tiny_bert(tmp_path_factory.mktemp("tiny-guide"), width=16, seed=1)  # another width, other weights
    return model, guide


def loss_and_grads(model: nn.Module, loss: nn.Module, batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    value = loss(copy.deepcopy(batch), None)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value.detach(), grads




@pytest.mark.parametrize("columns, hyper", [
    (("anchor", "positive"), {}),  # GISTEmbedLoss's defaults
    (("anchor", "positive", "negative"), {"temperature": 0.05, "margin_strategy": "absolute", "margin": 0.05}),
    (("anchor", "positive", "negative"), {"temperature": 0.05, "margin_strategy": "relative", "margin": 0.1,
                                          "contrast_anchors": False}),
    (("anchor", "positive"), {"margin_strategy": "relative", "margin": 0.02, "contrast_positives": False}),
])
def test_equals_gist_embed_loss(folders, columns, hyper):
    model, guide = tiny_sentence_transformer(folders[0]), tiny_sentence_transformer(folders[1])
    batch = features(model, columns)
    want_loss, want = loss_and_grads(model, GISTEmbedLoss(model, guide, **hyper), batch)
    guide_calls = []
    guide[0].register_forward_pre_hook(lambda m, args: guide_calls.append(args[0]["input_ids"].shape[0]))
    ours = GradCacheGISTLoss(model, guide, **hyper, chunk_size=3)
    got_loss, got = loss_and_grads(model, ours, batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)
    assert guide_calls == [3, 3, 1] * len(columns)  # each chunk once, in phase (1); never re-encoded
    assert all(p.grad is None for p in guide.parameters())
    assert not [p for p in ours.parameters() if p.requires_grad and p.grad is not None]


def test_matryoshka_around_it_equals_matryoshka_around_gist_embed_loss(folders):
    model, guide = tiny_sentence_transformer(folders[0]), tiny_sentence_transformer(folders[1])
    batch = features(model, ("anchor", "positive", "negative"))
    dims, weights = [32, 8], [1.0, 2.0]
    want_loss, want = loss_and_grads(model, MatryoshkaLoss(model, GISTEmbedLoss(model, guide, 0.05), dims, weights), batch)
    ours = MatryoshkaLoss(model, GradCacheGISTLoss(model, guide, 0.05, chunk_size=3), dims, weights)
    got_loss, got = loss_and_grads(model, ours, batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


@pytest.mark.slow
def test_packaged_minilm_with_a_retokenizing_guide_equals_gist_embed_loss(folders):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path()), device="cpu").eval()
    guide = tiny_sentence_transformer(folders[1])  # max_seq_length 64 < MiniLM's: both losses retokenize
    batch = features(model, ("anchor", "positive"), rows=4)
    theirs = GISTEmbedLoss(model, guide, temperature=0.05)
    ours = GradCacheGISTLoss(model, guide, temperature=0.05, chunk_size=2)
    assert theirs.must_retokenize and ours.must_retokenize
    want_loss, want = loss_and_grads(model, theirs, batch)
    got_loss, got = loss_and_grads(model, ours, batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want, 1e-4)


def test_bad_input_is_refused_before_anything_runs(folders):
    model, guide = tiny_sentence_transformer(folders[0]), tiny_sentence_transformer(folders[1])
    with pytest.raises(TypeError, match="guide must be a SentenceTransformer"):
        GradCacheGISTLoss(model, "all-MiniLM-L6-v2")
    with pytest.raises(TypeError, match="guide must be a SentenceTransformer"):
        GradCacheGISTLoss(model, nn.Linear(3, 3))
    with pytest.raises(ValueError, match="margin_strategy must be one of"):
        GradCacheGISTLoss(model, guide, margin_strategy="cosine")
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        GradCacheGISTLoss(model, guide, chunk_size=0)
    calls = []
    for module in (model[0], guide[0]):
        module.register_forward_pre_hook(lambda m, args: calls.append(1))
    loss = GradCacheGISTLoss(model, guide, chunk_size=3)
    with pytest.raises(ValueError, match="pairs or .* triplets"):
        loss(features(model, ("anchor", "positive", "negative", "negative")), None)
    with pytest.raises(ValueError, match="pairs or .* triplets"):
        loss(features(model, ("anchor",)), None)
    assert calls == []
