"""GradCacheLoss as sentence-transformers' cached losses are used: inside MatryoshkaLoss (against MatryoshkaLoss
around the uncached MultipleNegativesRankingLoss), refused inside AdaptiveLayerLoss, a default step with dropout
on against CachedMultipleNegativesRankingLoss's, its progress bar, and one GradCache kept across calls."""
from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    AdaptiveLayerLoss, CachedMultipleNegativesRankingLoss, MatryoshkaLoss, MultipleNegativesRankingLoss,
)

from gradcache.integrations.sentence_transformers import GradCacheLoss  # noqa: E402
from gradcache.losses import ClipLoss, InfoNCE  # noqa: E402
from gradcache.non_finite import NonFiniteLossError  # noqa: E402
from tests.integrations.sentence_models import (  # noqa: E402
    assert_close, features, minilm_path, save_tiny_bert, tiny_sentence_transformer,
)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def dropout_folder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-dropout"), dropout=0.3)


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device="cpu")


def loss_and_grads(model: nn.Module, loss: nn.Module, batch, seed: int = 0, *extra: nn.Module):
    """The loss's value and every gradient of the model (and of `extra` modules), from one seeded call."""
    modules = (model, *extra)
    for module in modules:
        module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    random.seed(seed)  # MatryoshkaLoss's n_dims_per_step samples with Python's random
    value = loss(copy.deepcopy(batch), None)
    value.backward()
    grads = {f"{i}.{n}": p.grad.clone() for i, m in enumerate(modules) for n, p in m.named_parameters()
             if p.grad is not None}
    for module in modules:
        module.zero_grad(set_to_none=True)
    return value.detach(), grads




# --- MatryoshkaLoss -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("columns, dims, weights, per_step", [
    (("anchor", "positive"), [32, 16, 8], None, -1),
    (("anchor", "positive", "negative"), [32, 16, 8], [1.0, 0.5, 2.0], -1),
    (("anchor", "positive", "negative"), [32, 24, 16, 8], [1.0, 0.5, 2.0, 3.0], 2),  # n_dims_per_step
])
def test_matryoshka_around_gradcache_equals_matryoshka_around_mnrl(bert_folder, columns, dims, weights, per_step):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, columns)
    theirs = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=20.0), dims, weights, per_step)
    ours = MatryoshkaLoss(model, GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=3), dims, weights, per_step)
    for seed in (0, 1):  # two steps: a kept strategy, and (n_dims_per_step) other dimensions
        want_loss, want = loss_and_grads(model, theirs, batch, seed)
        got_loss, got = loss_and_grads(model, ours, batch, seed)
        assert torch.allclose(got_loss, want_loss, rtol=1e-5)
        assert_close(got, want)


def test_matryoshka_on_packaged_minilm_equals_mnrl(minilm):
    model = minilm.eval()  # eval: dropout off, gradients on
    batch = features(model, ("anchor", "positive"), rows=4)
    dims, weights = [384, 128, 32], [1.0, 0.5, 0.25]
    want_loss, want = loss_and_grads(model, MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), dims, weights), batch)
    ours = MatryoshkaLoss(model, GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=2), dims, weights)
    got_loss, got = loss_and_grads(model, ours, batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want, 1e-4)


def test_matryoshka_weights_reach_a_learnable_temperature(bert_folder):
    """sum_d w_d ClipLoss(shrink(a, d), shrink(p, d)) in one full-batch forward: every model gradient and the
    logit scale's, which no cached loss of sentence-transformers has."""
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive"))
    dims, weights = [32, 8], [1.0, 3.0]
    clip = ClipLoss(temperature=0.1, learnable=True)
    anchor, positive = (model(copy.deepcopy(f))["sentence_embedding"] for f in batch)
    sum(w * clip(F.normalize(anchor[:, :d], dim=-1), F.normalize(positive[:, :d], dim=-1))
        for d, w in zip(dims, weights)).backward()
    want = {f"{i}.{n}": p.grad.clone() for i, m in enumerate((model, clip)) for n, p in m.named_parameters()
            if p.grad is not None}
    ours = MatryoshkaLoss(model, GradCacheLoss(model, clip, chunk_size=3), dims, weights)
    _, got = loss_and_grads(model, ours, batch, 0, clip)
    assert_close(got, want)
    assert torch.allclose(got["1.logit_scale"], want["1.logit_scale"], rtol=1e-4)


# --- AdaptiveLayerLoss --------------------------------------------------------------------------------------
def test_adaptive_layer_loss_is_refused_at_its_first_call(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    calls = []
    model[0].auto_model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(1), with_kwargs=True)
    with pytest.warns(UserWarning):  # sentence-transformers' own warning at construction
        loss = AdaptiveLayerLoss(model, GradCacheLoss(model, chunk_size=3))
    with pytest.raises(TypeError, match=r"forward replaced by .*Decorator.*MultipleNegativesRankingLoss"):
        loss(features(model, ("anchor", "positive")), None)
    assert calls == [] and all(p.grad is None for p in model.parameters())  # refused before anything ran
    GradCacheLoss(model, chunk_size=3)(features(model, ("anchor", "positive")), None)  # AdaptiveLayerLoss unpatched


# --- the default step: CachedMultipleNegativesRankingLoss's, with dropout on ----------------------------------
def _dropout_step_pair(model, matryoshka: bool, **options):
    ours = GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=3, **options)
    theirs = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=3)
    if matryoshka:
        ours, theirs = (MatryoshkaLoss(model, loss, [32, 16], [1.0, 2.0]) for loss in (ours, theirs))
    return ours, theirs


@pytest.mark.parametrize("matryoshka", [False, True], ids=["plain", "matryoshka"])
def test_a_default_step_with_dropout_equals_cached_mnrl(dropout_folder, matryoshka):
    model = tiny_sentence_transformer(dropout_folder).double().train()  # float64: rounding far below the masks
    batch = features(model, ("anchor", "positive", "negative"))
    ours, theirs = _dropout_step_pair(model, matryoshka)
    want_loss, want = loss_and_grads(model, theirs, batch, seed=3)
    got_loss, got = loss_and_grads(model, ours, batch, seed=3)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_close(got, want, 1e-10)
    untrimmed, _ = _dropout_step_pair(model, matryoshka, trim_padding=False)  # other widths draw other masks
    _, other = loss_and_grads(model, untrimmed, batch, seed=3)
    with pytest.raises(AssertionError, match="max error"):
        assert_close(other, want, 1e-3)


@pytest.mark.slow
def test_a_default_step_with_dropout_on_packaged_minilm_equals_cached_mnrl(minilm):
    model = copy.deepcopy(minilm).double().train()  # float64: its loss here is ~2e-3, float32 would blur it
    batch = features(model, ("anchor", "positive"), rows=4)
    want_loss, want = loss_and_grads(model, CachedMultipleNegativesRankingLoss(model, mini_batch_size=2), batch, seed=5)
    got_loss, got = loss_and_grads(model, GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=2), batch, seed=5)
    assert torch.allclose(got_loss, want_loss, rtol=1e-10)
    assert_close(got, want, 1e-9)


# --- the progress bar, the options' spelling, one GradCache across calls --------------------------------------
def test_show_progress_bar_counts_the_chunks_of_both_passes(bert_folder, capsys):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive"))  # two columns of 7 rows in chunks of 3: 6 chunks
    loss_and_grads(model, GradCacheLoss(model, chunk_size=3), batch)
    assert "GradCache" not in capsys.readouterr().err  # off by default
    loss_and_grads(model, GradCacheLoss(model, chunk_size=3, show_progress_bar=True), batch)
    err = capsys.readouterr().err
    assert "GradCache (1) encode chunks" in err and "GradCache (3) re-encode chunks" in err
    assert err.count("6/6") >= 2
    with torch.no_grad():  # evaluation: phase (1) only
        GradCacheLoss(model, chunk_size=3, show_progress_bar=True)(copy.deepcopy(batch), None)
    err = capsys.readouterr().err
    assert "(1) encode chunks" in err and "(3)" not in err


def test_options_are_spelled_as_in_sentence_transformers(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    with pytest.raises(TypeError, match="spelled gather_across_devices"):
        GradCacheLoss(model, chunk_size=3, gather=True)
    with pytest.raises(TypeError, match="show_progress_bar must be True or False"):
        GradCacheLoss(model, chunk_size=3, show_progress_bar="yes")
    config = GradCacheLoss(model, chunk_size=3).get_config_dict()
    assert config["trim_padding"] is True and config["gather_across_devices"] is False


class _NonFiniteOnSecondCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loss, self.calls = InfoNCE(temperature=0.05), 0

    def forward(self, *columns):
        self.calls += 1
        value = self.loss(*columns)
        return value * float("nan") if self.calls == 2 else value


def test_one_gradcache_across_calls_counts_the_steps(bert_folder):
    model = tiny_sentence_transformer(bert_folder)
    batch = features(model, ("anchor", "positive"))
    loss = GradCacheLoss(model, _NonFiniteOnSecondCall(), chunk_size=3)
    loss_and_grads(model, loss, batch)
    assert loss.steps_taken == 1
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        loss(copy.deepcopy(batch), None)
    assert all(p.grad is None for p in model.parameters())
