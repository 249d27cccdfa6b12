"""GradCacheCrossEncoderLoss against sentence-transformers' cross-encoder losses on a tiny CrossEncoder built in
the test: the uncached MultipleNegativesRankingLoss (value and gradient, float64, 1e-6), the cached
CachedMultipleNegativesRankingLoss step with dropout on (its in-batch draw and its mini-batches), one
CrossEncoderTrainer step against the peer's, both spellings of each option, and bad input."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")

from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402
from sentence_transformers.cross_encoder.losses import (  # noqa: E402
    CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss,
)

from gradcache.integrations.sentence_transformers import GradCacheCrossEncoderLoss  # noqa: E402
from tests.tiny_cross_encoder import PASSAGES, QUERIES, write_tiny_cross_encoder  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROWS = 5
COLUMNS = [QUERIES[:ROWS], PASSAGES[:ROWS], PASSAGES[ROWS : 2 * ROWS]]  # anchor, positive, hard negative


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross-encoder")
    return {p: write_tiny_cross_encoder(root / f"dropout{p}", dropout=p) for p in (0.0, 0.1)}


_LOADED: dict[float, CrossEncoder] = {}


def cross_encoder(folders, dropout: float) -> CrossEncoder:
    """A fresh float64 copy of the tiny CrossEncoder (loaded once per dropout), in train mode."""
    if dropout not in _LOADED:
        _LOADED[dropout] = CrossEncoder(str(folders[dropout]), device="cpu").double()
    return copy.deepcopy(_LOADED[dropout]).train()


def step(loss: nn.Module, model: nn.Module, columns, seed: int = 7) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    value = loss([list(c) for c in columns], None)
    value.backward()
    return value.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(got: dict, want: dict, rel: float) -> None:
    assert got.keys() == want.keys() and want
    scale = max(w.abs().max().item() for w in want.values())
    for name in want:
        error = (got[name] - want[name]).abs().max().item()
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("num_negatives,columns,chunk_size", [
    (2, 3, 3),      # two drawn, one hard column: groups of 4 over 20 pairs, chunks of 3 cut them
    (None, 2, 4),   # every other positive: groups of 5 over 25 pairs
    (4, 2, 25),     # the default draw, one chunk
])
def test_equals_the_uncached_peer(folders, num_negatives, columns, chunk_size):
    """Dropout off: in value and gradient on every parameter, to 1e-6 (float64). The peer draws its negatives
    after its first forward, GradCache before any: without dropout the draw sees the same generator state."""
    model = cross_encoder(folders, 0.0)
    want_value, want = step(MultipleNegativesRankingLoss(model, num_negatives=num_negatives), model,
                            COLUMNS[:columns])
    got_value, got = step(GradCacheCrossEncoderLoss(model, num_negatives=num_negatives, chunk_size=chunk_size),
                          model, COLUMNS[:columns])
    assert got_value == pytest.approx(want_value, rel=1e-6, abs=1e-9)
    assert_close(got, want, rel=1e-6)


def test_a_seeded_step_with_dropout_equals_the_cached_peer(folders):
    """Dropout on: the same multinomial draw first, the same mini-batches, the same masks replayed."""
    model = cross_encoder(folders, 0.1)
    want_value, want = step(CachedMultipleNegativesRankingLoss(model, num_negatives=3, mini_batch_size=6), model,
                            COLUMNS)
    got_value, got = step(GradCacheCrossEncoderLoss(model, num_negatives=3, mini_batch_size=6), model, COLUMNS)
    assert got_value == pytest.approx(want_value, rel=1e-10)
    assert_close(got, want, rel=1e-8)
    other_value, _ = step(GradCacheCrossEncoderLoss(model, num_negatives=3, mini_batch_size=6), model, COLUMNS, seed=8)
    assert abs(other_value - want_value) > 1e-6  # another seed draws other negatives and masks: the check can fail


def test_prompt_reaches_every_chunk(folders):
    model = cross_encoder(folders, 0.0)
    torch.manual_seed(0)
    want = MultipleNegativesRankingLoss(model, num_negatives=2)([list(c) for c in COLUMNS], None, prompt="q: ")
    torch.manual_seed(0)
    with torch.no_grad():
        got = GradCacheCrossEncoderLoss(model, num_negatives=2, chunk_size=3)([list(c) for c in COLUMNS], None,
                                                                             prompt="q: ")
    assert got.item() == pytest.approx(want.item(), rel=1e-10)


@pytest.mark.slow
def test_one_trainer_step_equals_the_peers(folders, tmp_path):
    """CrossEncoderTrainer, dropout on, one step from the same seed: the same parameters afterwards."""
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments

    def train(ours: bool) -> dict[str, torch.Tensor]:
        model = cross_encoder(folders, 0.1)
        loss = (GradCacheCrossEncoderLoss(model, num_negatives=2, temperature=0.1, chunk_size=4) if ours
                else CachedMultipleNegativesRankingLoss(model, num_negatives=2, scale=10.0, mini_batch_size=4))
        args = CrossEncoderTrainingArguments(
            str(tmp_path / ("ours" if ours else "peer")), per_device_train_batch_size=4, max_steps=1,
            learning_rate=1e-2, max_grad_norm=0.0, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=3)
        data = datasets.Dataset.from_dict({"anchor": QUERIES[:8], "positive": PASSAGES[:8],
                                           "negative": PASSAGES[8:16]})
        CrossEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    start = {n: p.detach().clone() for n, p in cross_encoder(folders, 0.1).named_parameters()}
    peer, ours = train(False), train(True)
    moved = {n: peer[n] - start[n] for n in peer}
    assert max(d.abs().max().item() for d in moved.values()) > 1e-4  # the step moved the weights
    assert_close({n: ours[n] - start[n] for n in ours}, moved, rel=1e-6)


# --- spellings and defaults -----------------------------------------------------------------------------
def test_the_peers_defaults(folders):
    loss = GradCacheCrossEncoderLoss(cross_encoder(folders, 0.0))
    assert (loss.num_negatives, loss.scale, loss.mini_batch_size, type(loss.activation_fn)) == (4, 10.0, 32, nn.Sigmoid)
    assert loss.get_config_dict() == {**MultipleNegativesRankingLoss(loss.model).get_config_dict(),
                                      "mini_batch_size": 32}


@pytest.mark.parametrize("spelled,temperature,chunk_size", [
    (dict(scale=20.0), 0.05, 32), (dict(temperature=0.05), 0.05, 32), (dict(scale=20.0, temperature=0.05), 0.05, 32),
    (dict(mini_batch_size=8), 0.1, 8), (dict(chunk_size=8), 0.1, 8), (dict(chunk_size=8, mini_batch_size=8), 0.1, 8),
    (dict(scale=4.0, chunk_size=2), 0.25, 2), (dict(temperature=0.5, mini_batch_size=3), 0.5, 3),
])
def test_both_spellings_in_any_combination(folders, spelled, temperature, chunk_size):
    loss = GradCacheCrossEncoderLoss(cross_encoder(folders, 0.0), **spelled)
    assert loss.temperature == pytest.approx(temperature, rel=1e-12) and loss.chunk_size == chunk_size


@pytest.mark.parametrize("options,error,match", [
    (dict(scale=20.0, temperature=0.1), ValueError, r"temperature=0\.1 and scale=20\.0, which disagree"),
    (dict(chunk_size=8, mini_batch_size=16), ValueError, "chunk_size=8 and mini_batch_size=16, which disagree"),
    (dict(chunk_size=0), ValueError, "got chunk_size=0; chunk_size must be an int >= 1"),
    (dict(mini_batch_size=0), ValueError, "got mini_batch_size=0; mini_batch_size must be an int >= 1"),
    (dict(scale=0.0), ValueError, r"got scale=0\.0; scale must be a finite number > 0"),
    (dict(temperature=-1.0), ValueError, r"got temperature=-1\.0; temperature must be a finite number > 0"),
    (dict(num_negatives=0), ValueError, "num_negatives"),
    (dict(split_fn=lambda v, n: [v]), TypeError, "split_fn"),
    (dict(gather=True), TypeError, "gather"),
])
def test_bad_options_are_refused(folders, options, error, match):
    with pytest.raises(error, match=match):
        GradCacheCrossEncoderLoss(cross_encoder(folders, 0.0), **options)


def test_bad_models_and_columns_are_refused(folders, tmp_path):
    with pytest.raises(ValueError, match="expects a CrossEncoder"):
        GradCacheCrossEncoderLoss(nn.Linear(2, 1))
    model = cross_encoder(folders, 0.0)
    loss = GradCacheCrossEncoderLoss(model)
    with pytest.raises(ValueError, match="1 column"):
        loss([COLUMNS[0]], None)
    with pytest.raises(ValueError, match="different lengths"):
        loss([COLUMNS[0], COLUMNS[1][:3]], None)
    assert all(p.grad is None for p in model.parameters())
