"""GradCacheSpladeLoss against sentence-transformers' uncached SpladeLoss(SparseMultipleNegativesRankingLoss) on a
tiny SparseEncoder built here (one-layer BERT MLM head, 32 wide, a character vocabulary written here): loss parts and the gradient on
every parameter (float64), one SparseEncoderTrainer step, and the refusals."""
from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from sentence_transformers.sparse_encoder import (  # noqa: E402
    SparseEncoder, SparseEncoderTrainer, SparseEncoderTrainingArguments,
)
from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss  # noqa: E402
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheSpladeLoss  # noqa: E402
from gradcache.losses import InfoNCE, L1Regularizer  # noqa: E402
from tests.integrations.sentence_models import COLUMNS, assert_close, features  # noqa: E402
from tests.tiny_text_model import CHARACTERS, SPECIAL  # noqa: E402

PARTS = ["base_loss", "document_regularizer_loss", "query_regularizer_loss"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A one-layer BERT with its MLM head, random weights, the character tokenizer of tests/tiny_text_model.py;
    the head's bias lowered so that some logits are negative (zeros in the SPLADE rows)."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    folder = tmp_path_factory.mktemp("splade")
    vocab = SPECIAL + CHARACTERS + [f"##{c}" for c in CHARACTERS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=128)
    mlm = BertForMaskedLM(config)
    with torch.no_grad():
        mlm.cls.predictions.bias -= 0.1
    mlm.save_pretrained(folder)
    return folder


def sparse_encoder(folder, dtype=torch.float32) -> SparseEncoder:
    logging.getLogger("sentence_transformers.sparse_encoder.models.MLMTransformer").setLevel(logging.ERROR)
    model = SparseEncoder(modules=[MLMTransformer(str(folder)), SpladePooling("max")], device="cpu")
    return model.to(dtype)


def gradients(model, loss_module, feats):
    model.zero_grad(set_to_none=True)
    parts = loss_module(feats, None)
    sum(parts.values()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in parts.items()}, grads


@pytest.mark.parametrize("query_weight, spelling", [(0.3, {"chunk_size": 2}), (None, {"mini_batch_size": 3}),
                                                    (0.3, {"chunk_size": 2, "sparse_cache": False}),
                                                    (0.3, {"chunk_size": 2, "temperature": 0.5})])
def test_parts_and_gradients_equal_the_uncached_peer(folder, query_weight, spelling):
    model = sparse_encoder(folder, torch.float64)
    feats = features(model, rows=5)
    scale = 1.0 / spelling["temperature"] if "temperature" in spelling else 1.0
    peer = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, scale=scale), 0.2, query_weight)
    want_parts, want = gradients(model, peer, feats)
    ours = GradCacheSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 0.2, query_weight, **spelling)
    got_parts, got = gradients(model, ours, feats)
    rows = model(features(model, rows=5)[0])["sentence_embedding"]
    assert 0 < int((rows == 0).sum()) < rows.numel()  # zeros for the sparse cache to drop, and non-zeros
    assert list(got_parts) == list(want_parts) == PARTS[:2 if query_weight is None else 3]
    for name in want_parts:
        torch.testing.assert_close(got_parts[name], want_parts[name], rtol=1e-6, atol=1e-12)
    assert len(want) == len(list(model.parameters()))  # every parameter has its gradient
    assert_close(got, want, rel=1e-6)


def test_the_peers_default_base_loss_is_computed_from_the_non_zeros(folder, monkeypatch):
    """With the sparse cache and SparseMultipleNegativesRankingLoss's defaults, phase (2) reads the rows' non-zeros
    (gradcache/losses/sparse_scores.py), never `calculate_loss` on dense rows."""
    from gradcache.integrations.sentence_transformers import splade as module

    model = sparse_encoder(folder, torch.float64)
    called, original = [], module.sparse_infonce
    monkeypatch.setattr(module, "sparse_infonce", lambda *args: called.append(args) or original(*args))
    monkeypatch.setattr(GradCacheSpladeLoss, "calculate_loss", lambda *args, **kwargs: pytest.fail("dense path"))
    ours = GradCacheSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 0.2, 0.3, chunk_size=2)
    sum(ours(features(model, rows=5), None).values()).backward()
    assert len(called) == 1


def test_a_library_base_loss_and_regularizer_equal_the_peer(folder):
    model = sparse_encoder(folder, torch.float64)
    feats = features(model, columns=("anchor", "positive"), rows=4)

    class L1:  # the peer's regularisers are modules with compute_loss_from_embeddings
        def compute_loss_from_embeddings(self, rows):
            return rows.abs().sum(dim=1).mean()

    peer = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, scale=4.0), 0.2, 0.1,
                      document_regularizer=L1(), query_regularizer=L1())
    want_parts, want = gradients(model, peer, feats)
    ours = GradCacheSpladeLoss(model, InfoNCE(temperature=0.25, similarity="dot"), 0.2, 0.1, chunk_size=3,
                               document_regularizer=L1Regularizer(), query_regularizer=L1Regularizer())
    got_parts, got = gradients(model, ours, feats)
    for name in want_parts:
        torch.testing.assert_close(got_parts[name], want_parts[name], rtol=1e-6, atol=1e-12)
    assert_close(got, want, rel=1e-6)


class _GradientsBeforeStep(TrainerCallback):
    def __init__(self) -> None:
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def train(folder, tmp, ours: bool):
    model = sparse_encoder(folder)
    base = SparseMultipleNegativesRankingLoss(model)
    loss = (GradCacheSpladeLoss(model, base, 3e-3, 5e-3, mini_batch_size=2) if ours
            else SpladeLoss(model, base, 3e-3, 5e-3))
    args = SparseEncoderTrainingArguments(
        os.path.join(tmp, "ours" if ours else "peer"), per_device_train_batch_size=5, max_steps=2,
        learning_rate=1e-3, max_grad_norm=0.0, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=3)
    grab = _GradientsBeforeStep()
    data = datasets.Dataset.from_dict(copy.deepcopy(COLUMNS))
    trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss, callbacks=[grab])
    trainer.train()
    return trainer, grab


@pytest.mark.slow
def test_trainer_steps_equal_the_peers(folder, tmp_path):
    peer, peer_grads = train(folder, tmp_path, ours=False)
    ours, our_grads = train(folder, tmp_path, ours=True)
    assert len(our_grads.grads) == len(peer_grads.grads) == 2
    for got, want in zip(our_grads.grads, peer_grads.grads):
        assert_close(got, want, rel=1e-5)
    # the trainer gave ours the peer's regulariser-weight warm-up: the weights moved the same way
    assert ours.loss.document_regularizer_weight == pytest.approx(peer.loss.document_regularizer_weight)
    assert ours.loss.query_regularizer_weight == pytest.approx(peer.loss.query_regularizer_weight)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(chunk_size=2, mini_batch_size=3), ValueError, "chunk_size=2 and mini_batch_size=3, which disagree"),
    (dict(temperature=0.5, scale=3.0), ValueError, r"temperature=0\.5 and scale=3\.0, which disagree"),
    (dict(temperature=0.0), ValueError, r"got temperature=0\.0; temperature must be a finite number > 0"),
    (dict(document_regularizer_weight=-1.0), ValueError, "document_regularizer_weight must be a number >= 0"),
    (dict(document_regularizer_threshold=3, document_regularizer=L1Regularizer()), ValueError,
     "document_regularizer_threshold=3 applies to the default FLOPS"),
    (dict(chunk_size=0), ValueError, "got chunk_size=0; chunk_size must be an int >= 1"),
    (dict(scaler=object()), TypeError, "scaler"),
])
def test_bad_arguments_are_refused(folder, kwargs, error, match):
    model = sparse_encoder(folder)
    base = SparseMultipleNegativesRankingLoss(model)
    arguments = {"document_regularizer_weight": 0.1, **kwargs}
    with pytest.raises(error, match=match):
        GradCacheSpladeLoss(model, base, **arguments)
    assert base.scale == 1.0  # a refused call changes nothing


def test_temperature_for_a_loss_without_one_is_refused(folder):
    model = sparse_encoder(folder)

    class NoScale(torch.nn.Module):
        def forward(self, a, b):
            return (a * b).sum()

    with pytest.raises(TypeError, match="has neither a `scale` nor a fixed `temperature`"):
        GradCacheSpladeLoss(model, NoScale(), 0.1, scale=2.0)


def test_one_column_is_refused(folder):
    model = sparse_encoder(folder)
    loss = GradCacheSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 0.1, 0.1)
    with pytest.raises(ValueError, match="got 1 column"):
        loss(features(model, columns=("anchor",), rows=3), None)


def test_evaluation_returns_the_peers_parts(folder):
    model = sparse_encoder(folder, torch.float64)
    feats = features(model, rows=4)
    peer = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 0.2, 0.3)
    ours = GradCacheSpladeLoss(model, SparseMultipleNegativesRankingLoss(model), 0.2, 0.3, chunk_size=3)
    with torch.no_grad():
        want, got = peer(feats, None), ours(feats, None)
    assert list(got) == PARTS
    for name in PARTS:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-12)
