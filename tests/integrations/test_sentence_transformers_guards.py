"""Guards of the sentence-transformers losses: a loss that leaves a column unused and a StaticEmbedding model are
refused as sentence-transformers refuses them, and GradCacheGISTLoss keeps GISTEmbedLoss's filter when a row's hard
negative is another row's positive (equal texts encoded in other chunks differ by rounding), float32 and float64,
value and gradient against GISTEmbedLoss computed here."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    CachedMultipleNegativesRankingLoss, GISTEmbedLoss,
)

from gradcache.integrations.sentence_transformers import GradCacheGISTLoss, GradCacheLoss  # noqa: E402
from tests.integrations.sentence_models import (  # noqa: E402
    COLUMNS, assert_close, features, save_tiny_bert, tiny_sentence_transformer,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    model = save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    guide = save_tiny_bert(tmp_path_factory.mktemp("tiny-guide"), width=16, seed=1)
    return model, guide


class AnchorAndPositiveOnly(nn.Module):
    """A loss over (anchor, positive) that ignores the hard negatives it is given."""

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None):
        return -(nn.functional.normalize(anchor) * nn.functional.normalize(positive)).sum(1).mean()


def test_a_loss_that_leaves_a_column_unused_is_refused_as_sentence_transformers_refuses_it(folders):
    model = tiny_sentence_transformer(folders[0])
    batch = features(model, ("anchor", "positive", "negative"), rows=5)

    class TheirsIgnoringNegatives(CachedMultipleNegativesRankingLoss):
        def calculate_loss(self, reps, labels=None, with_backward=False):
            return super().calculate_loss(reps[:2], labels, with_backward=with_backward)

    with pytest.raises(ValueError, match="did not use input column"):  # the peer's own refusal
        TheirsIgnoringNegatives(model, mini_batch_size=2)(copy.deepcopy(batch), None).backward()
    model.zero_grad(set_to_none=True)
    ours = GradCacheLoss(model, AnchorAndPositiveOnly(), chunk_size=2)
    with pytest.raises(ValueError, match=r"did not use input column\(s\) 2 \(counting from 0\) of the 3"):
        ours(copy.deepcopy(batch), None)
    assert all(p.grad is None for p in model.parameters())
    ours(copy.deepcopy(batch[:2]), None).backward()  # the same loss over the columns it reads is fine
    assert any(p.grad is not None for p in model.parameters())


def static_model(folder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_dim=8)], device="cpu")


def test_a_static_embedding_model_or_guide_is_refused_with_a_clear_error(folders):
    static, bert = static_model(folders[0]), tiny_sentence_transformer(folders[1])
    refused = r"GradCacheGISTLoss got a model based on a StaticEmbedding \(model\.0\).*GISTEmbedLoss"
    with pytest.raises(ValueError, match=refused):
        GradCacheGISTLoss(static, bert)
    with pytest.raises(ValueError, match=r"GradCacheGISTLoss got a guide based on a StaticEmbedding \(guide\.0\)"):
        GradCacheGISTLoss(bert, static)
    refused = r"GradCacheLoss got a model based on a StaticEmbedding.*MultipleNegativesRankingLoss"
    with pytest.raises(ValueError, match=refused):
        GradCacheLoss(static)


ANCHORS = COLUMNS["anchor"][:8]
POSITIVES = COLUMNS["positive"][:8]
NEGATIVES = [POSITIVES[(i + 3) % 8] for i in range(8)]  # row i's hard negative is row i + 3's positive


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("temperature", [0.5, 0.01])
def test_gist_with_duplicate_texts_across_chunks_equals_gist_embed_loss(folders, dtype, rel, temperature):
    model = tiny_sentence_transformer(folders[0]).to(dtype)
    guide = tiny_sentence_transformer(folders[1]).to(dtype).eval()
    batch = [model.preprocess(column) for column in (ANCHORS, POSITIVES, NEGATIVES)]

    def run(loss):
        model.zero_grad(set_to_none=True)
        value = loss(copy.deepcopy(batch), None)
        value.backward()
        return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want_loss, want = run(GISTEmbedLoss(model, guide, temperature=temperature))
    with torch.no_grad():  # the reference's own decision is no tie broken by rounding: its duplicates are equal
        positives, negatives = (guide(copy.deepcopy(batch[c]))["sentence_embedding"] for c in (1, 2))
    assert all(torch.equal(negatives[i], positives[(i + 3) % 8]) for i in range(8))
    for chunk_size in (2, 3, 8):
        got_loss, got = run(GradCacheGISTLoss(model, guide, temperature=temperature, chunk_size=chunk_size))
        assert torch.allclose(got_loss, want_loss, rtol=rel, atol=0), (chunk_size, got_loss, want_loss)
        assert_close(got, want, rel)


@pytest.mark.slow
def test_packaged_minilm_with_duplicate_texts_in_chunks_of_4_equals_gist_embed_loss():
    """The issue's case on all-MiniLM-L6-v2, model and guide, 16 rows in chunks of 4 (1.034 against 1.146 with a
    strict comparison)."""
    from sentence_transformers import SentenceTransformer

    from tests.integrations.sentence_models import minilm_path

    model = SentenceTransformer(str(minilm_path()), device="cpu").eval()
    guide = SentenceTransformer(str(minilm_path()), device="cpu").eval()
    anchors = (COLUMNS["anchor"] + COLUMNS["negative"])[:16]
    positives = (COLUMNS["positive"] + COLUMNS["anchor"])[:16]
    negatives = [positives[(i + 5) % 16] for i in range(16)]
    batch = [model.preprocess(column) for column in (anchors, positives, negatives)]

    def run(loss):
        model.zero_grad(set_to_none=True)
        value = loss(copy.deepcopy(batch), None)
        value.backward()
        return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want_loss, want = run(GISTEmbedLoss(model, guide))
    got_loss, got = run(GradCacheGISTLoss(model, guide, chunk_size=4))
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want, 5e-5)


class TextsEncoder(nn.Module):
    """A SentenceTransformer that takes raw strings and tokenises them itself, as `model.encode` does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, texts: list[str]) -> torch.Tensor:
        return self.model(self.model.preprocess(texts))["sentence_embedding"]


def test_raw_strings_reach_a_tokenising_sentence_transformer_in_chunks(folders):
    from gradcache import FullBatch, GradCache
    from gradcache.losses import InfoNCE

    model = tiny_sentence_transformer(folders[0]).to(torch.float64)
    encoder, loss = TextsEncoder(model), InfoNCE(temperature=0.05)
    columns = COLUMNS["anchor"][:7], COLUMNS["positive"][:7], COLUMNS["negative"][:7]
    grads = []
    for strategy in (FullBatch(encoder, loss), GradCache(encoder, loss, chunk_size=3)):
        model.zero_grad(set_to_none=True)
        value = strategy.step(*columns)
        grads.append((value, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (want_loss, want), (got_loss, got) = grads
    assert torch.allclose(got_loss, want_loss, rtol=1e-10)
    assert_close(got, want, 1e-9)
