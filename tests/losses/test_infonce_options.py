"""InfoNCE's sentence-transformers options (similarity, directions, partition_mode, hardness) against
MultipleNegativesRankingLoss on the same embeddings, and GradCache/CachedLoss against the full batch for each."""

from __future__ import annotations

import pytest
import torch

from gradcache.losses import InfoNCE

from . import st_reference
from .strategies import assert_gradcache_equals_full_batch, batch

ALL = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
SETTINGS = [  # (directions, partition_mode)
    (("query_to_doc",), "joint"),
    (("query_to_doc",), "per_direction"),
    (("query_to_doc", "doc_to_query"), "joint"),
    (("query_to_doc", "doc_to_query"), "per_direction"),
    (("query_to_doc", "query_to_query"), "joint"),
    (("query_to_doc", "doc_to_doc"), "joint"),
    (ALL, "joint"),
]
HARDNESS = [(None, 0.0), ("in_batch_negatives", 9.0), ("hard_negatives", 5.0), ("all_negatives", 3.0)]


def _rows(n: int, hard_negatives: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(n, 5, generator=generator, dtype=torch.float64)
    positive = query + 0.7 * torch.randn(n, 5, generator=generator, dtype=torch.float64)
    negatives = 2 * torch.randn(n * hard_negatives, 5, generator=generator, dtype=torch.float64)
    return [query, positive] + ([negatives] if hard_negatives else [])


def _value_and_grads(loss_fn, rows):
    leaves = [t.clone().requires_grad_() for t in rows]
    loss = loss_fn(*leaves)
    return loss.detach(), torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("hardness_mode, hardness_strength", HARDNESS)
@pytest.mark.parametrize("directions, partition_mode", SETTINGS)
@pytest.mark.parametrize("n, hard_negatives, similarity, temperature", [
    (5, 0, "cosine", 0.05), (4, 2, "cosine", 0.05), (3, 1, "dot", 1.0), (1, 1, "cosine", 0.05),
])
def test_equals_multiple_negatives_ranking_loss(n, hard_negatives, similarity, temperature, directions,
                                                partition_mode, hardness_mode, hardness_strength):
    rows = _rows(n, hard_negatives, seed=n * 10 + hard_negatives)
    options = dict(directions=directions, partition_mode=partition_mode, hardness_mode=hardness_mode,
                   hardness_strength=hardness_strength)
    loss, grads = _value_and_grads(InfoNCE(temperature=temperature, similarity=similarity, **options), rows)
    reference, reference_grads = _value_and_grads(
        lambda query, positive, negatives=None: st_reference.mnrl(query, positive, negatives, temperature,
                                                                  similarity, **options), rows)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-12)


def test_each_option_changes_the_loss():
    # Guards the parity test above against options that silently do nothing on both sides.
    rows = _rows(5, 2, seed=4)
    base = InfoNCE(temperature=0.1)(*rows)
    for options in [dict(similarity="dot"), dict(directions=ALL), dict(directions=("query_to_doc", "doc_to_query")),
                    *(dict(hardness_mode=mode, hardness_strength=strength) for mode, strength in HARDNESS[1:])]:
        assert (InfoNCE(temperature=0.1, **options)(*rows) - base).abs() > 1e-6, options


def test_symmetric_is_shorthand_for_both_directions_per_direction():
    rows = _rows(6, 1, seed=2)
    shorthand = InfoNCE(temperature=0.1, symmetric=True)
    spelled = InfoNCE(temperature=0.1, directions=("doc_to_query", "query_to_doc"), partition_mode="per_direction")
    assert shorthand.symmetric and spelled.symmetric and spelled.directions == shorthand.directions
    torch.testing.assert_close(_value_and_grads(shorthand, rows), _value_and_grads(spelled, rows), rtol=0, atol=0)


@pytest.mark.parametrize("options", [
    dict(directions=ALL),
    dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"),
    dict(directions=("query_to_doc", "query_to_query", "positive_to_positive")),
    dict(similarity="dot", temperature=1.0),
    dict(hardness_mode="in_batch_negatives", hardness_strength=9.0),
    dict(hardness_mode="hard_negatives", hardness_strength=5.0),
    dict(hardness_mode="all_negatives", hardness_strength=3.0, directions=("query_to_doc", "doc_to_doc")),
])
def test_gradcache_equals_the_full_batch(options):
    options = {"temperature": 0.1, **options}
    assert_gradcache_equals_full_batch(InfoNCE(**options), batch(7, 2, seed=1))


@pytest.mark.parametrize("options, match", [
    (dict(directions=("query_to_query",)), r"directions must include 'query_to_doc'"),
    (dict(directions=("query_to_doc", "doc_to_queries")), r"unknown names \['doc_to_queries'\]"),
    (dict(directions=("query_to_doc", "query_to_doc")), r"lists a name twice"),
    (dict(directions=ALL, partition_mode="per_direction"), r"\['query_to_query', 'doc_to_doc'\] score only"),
    (dict(partition_mode="softmax"), r"partition_mode must be one of \('joint', 'per_direction'\), got 'softmax'"),
    (dict(symmetric=True, partition_mode="joint"), r"symmetric=True is shorthand for directions="),
    (dict(similarity="euclidean"), r"similarity must be one of \('cosine', 'dot'\), got 'euclidean'"),
    (dict(hardness_mode="hardest"), r"hardness_mode must be None or one of"),
    (dict(hardness_mode="hard_negatives", hardness_strength=-1.0), r"hardness_strength must be a finite number >= 0"),
    (dict(hardness_strength=5.0), r"hardness_strength=5.0 has no effect without hardness_mode"),
    (dict(hardness_mode="hard_negatives", hardness_strength=5.0, queue_size=8), r"queue_size=8 with hardness_mode"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        InfoNCE(**options)


def test_directions_as_one_string_is_a_type_error():
    with pytest.raises(TypeError, match=r"directions must be a tuple of names .* write \('query_to_doc',\)"):
        InfoNCE(directions="query_to_doc")


@pytest.mark.parametrize("options, named", [
    (dict(similarity="dot"), "similarity='dot'"),
    (dict(directions=ALL), "directions=("),
    (dict(directions=("query_to_doc", "doc_to_query")), "partition_mode='joint'"),
    (dict(hardness_mode="all_negatives", hardness_strength=1.0), "hardness_mode='all_negatives'"),
])
def test_tiles_refuse_what_they_do_not_compute(options, named):
    with pytest.raises(ValueError, match=r"tile_size=4 supports cosine similarity") as raised:
        InfoNCE(tile_size=4, **options)
    assert named in str(raised.value)


@pytest.mark.parametrize("options", [dict(), dict(symmetric=True),
                                     dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"),
                                     dict(partition_mode="per_direction")])
def test_tiles_compute_what_they_accept(options):
    rows = _rows(7, 1, seed=8)
    dense = _value_and_grads(InfoNCE(temperature=0.1, **options), rows)
    tiled = _value_and_grads(InfoNCE(temperature=0.1, tile_size=3, **options), rows)
    torch.testing.assert_close(tiled, dense, rtol=1e-12, atol=1e-12)


def test_positive_to_positive_is_doc_to_doc_without_hard_negatives_and_differs_with_them():
    # GIST's positive-positive block leaves out the other queries' hard negatives that doc_to_doc scores.
    positives_only = InfoNCE(temperature=0.1, directions=("query_to_doc", "positive_to_positive"))
    every_document = InfoNCE(temperature=0.1, directions=("query_to_doc", "doc_to_doc"))
    pairs, triplets = _rows(5, 0, seed=3), _rows(5, 1, seed=3)
    torch.testing.assert_close(_value_and_grads(positives_only, pairs), _value_and_grads(every_document, pairs),
                               rtol=1e-12, atol=1e-12)
    assert (positives_only(*triplets) - every_document(*triplets)).abs() > 1e-6
