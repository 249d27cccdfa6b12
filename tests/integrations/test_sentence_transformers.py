"""GradCacheLoss against sentence-transformers' own MultipleNegativesRankingLoss on the same model: value and
gradient of every parameter, with hard negatives, on a tiny BERT and on the packaged all-MiniLM-L6-v2."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.losses import MultipleNegativesRankingLoss  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheLoss  # noqa: E402
from gradcache.losses import ClipLoss, InfoNCE  # noqa: E402
from tests.integrations.sentence_models import (  # noqa: E402
    assert_close, features, minilm_path, save_tiny_bert, tiny_sentence_transformer,
)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def loss_and_grads(model: nn.Module, loss: nn.Module, sentence_features) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    value = loss(copy.deepcopy(sentence_features), None)
    value.backward()
    grads = {n: p.grad.clone() for n, p in [*model.named_parameters(), *loss.loss.named_parameters()]
             if p.grad is not None} if isinstance(loss, GradCacheLoss) else {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value.detach(), grads




@pytest.mark.parametrize("columns, temperature", [
    (("anchor", "positive"), 0.05),
    (("anchor", "positive", "negative", "negative"), 0.5),  # two hard-negative columns
])
def test_equals_multiple_negatives_ranking_loss(bert_folder, columns, temperature):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, columns)
    want_loss, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=1 / temperature), batch)
    got_loss, got = loss_and_grads(model, GradCacheLoss(model, InfoNCE(temperature=temperature), chunk_size=3), batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


@pytest.mark.slow
def test_packaged_minilm_equals_multiple_negatives_ranking_loss():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path()), device="cpu").eval()  # eval: dropout off, gradients on
    batch = features(model, ("anchor", "positive", "negative"), rows=5)
    want_loss, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=20.0), batch)
    got_loss, got = loss_and_grads(model, GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=2), batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want, 1e-4)


class _Wrapper(nn.Module):
    """What a trainer puts in place of loss.model (DDP, torch.compile): calls through, counting."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module, self.calls = model, 0

    def forward(self, features):
        self.calls += 1
        return self.module(features)


def test_reads_the_model_on_every_call(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive"))
    loss = GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=3)
    _, before = loss_and_grads(model, loss, batch)
    loss.model = _Wrapper(model)  # as sentence-transformers' override_model_in_loss does on the first step
    _, after = loss_and_grads(model, loss, batch)
    assert loss.model.calls == 2 * 2 * 3  # two columns of three chunks, in passes (1) and (3)
    assert_close(after, before)


def test_every_core_option_reaches_the_strategy(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive", "negative"))
    _, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=20.0), batch)
    widths = []
    model[0].register_forward_pre_hook(lambda m, args: widths.append(args[0]["input_ids"].shape[1]))
    trimmed = GradCacheLoss(model, InfoNCE(temperature=0.05, tile_size=2), chunk_size=2, trim_padding=True)
    _, got = loss_and_grads(model, trimmed, batch)
    assert min(widths) < max(widths) == max(f["input_ids"].shape[1] for f in batch)  # chunks were trimmed
    assert_close(got, want, 1e-4)
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        GradCacheLoss(model, chunk_size=0)
    with pytest.raises(TypeError, match="unknown option"):
        GradCacheLoss(model, chunk_size=2, chunk_tokenz=64)
    with pytest.raises(TypeError, match="cannot honour"):
        GradCacheLoss(model, chunk_size=2, scaler=torch.amp.GradScaler("cpu"))


@pytest.mark.parametrize("options", [{"chunk_tokens": 20}, {"memory_budget": 10**9}, {"memory_budget": 60_000}],
                         ids=["chunk_tokens", "budget-all", "budget-some"])
def test_the_memory_options_equal_multiple_negatives_ranking_loss(bert_folder, options):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive", "negative"))
    _, want = loss_and_grads(model, MultipleNegativesRankingLoss(model, scale=20.0), batch)
    calls = []
    model[0].register_forward_pre_hook(lambda m, args: calls.append(1))
    _, got = loss_and_grads(model, GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=3, **options), batch)
    assert_close(got, want, 1e-4)
    chunks = 3 * 3  # three columns of 7 rows in chunks of 3
    if "memory_budget" in options:  # a kept graph is not re-encoded: a budget for all encodes each chunk once
        assert len(calls) == chunks if options["memory_budget"] == 10**9 else chunks < len(calls) < 2 * chunks


def test_a_learnable_temperature_gets_the_full_batch_gradient(bert_folder):
    """ClipLoss on two columns, against the formula: both columns in one forward, one backward."""
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive"))
    clip = ClipLoss(temperature=0.1, learnable=True)
    embeddings = [model(copy.deepcopy(f))["sentence_embedding"] for f in batch]
    clip(*embeddings).backward()
    want = {n: p.grad.clone() for n, p in [*model.named_parameters(), *clip.named_parameters()]
            if p.grad is not None}  # BERT's pooler is unused
    clip.zero_grad(set_to_none=True)
    _, got = loss_and_grads(model, GradCacheLoss(model, clip, chunk_size=3), batch)
    assert_close(got, want)
    assert torch.allclose(got["logit_scale"], want["logit_scale"], rtol=1e-4)


def test_bad_calls_and_wrappers_say_what_to_do(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    loss = GradCacheLoss(model, chunk_size=3)
    with pytest.raises(ValueError, match="at least two text columns"):
        loss(features(model, ("anchor",)), None)
    loss.model = nn.DataParallel(model)
    with pytest.raises(TypeError, match="cannot run GradCache inside DataParallel"):
        loss(features(model, ("anchor", "positive")), None)
    with pytest.raises(TypeError, match="SentenceTransformer"):
        GradCacheLoss("all-MiniLM-L6-v2")
