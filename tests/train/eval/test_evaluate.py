import math
from itertools import combinations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gradcache.train.eval.images import (
    chance_recall,
    knn_top1,
    retrieval_recall,
    zero_shot_top1,
)


def _unit(rows, dim, seed):
    return F.normalize(torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)), dim=1).numpy()


@pytest.mark.parametrize("k, temperature", [(1, 0.1), (5, 0.1), (7, 0.5), (40, 0.07)])
def test_weighted_knn_against_a_loop(k, temperature):
    train, test = _unit(40, 6, 0), _unit(15, 6, 1)
    train_labels = torch.randint(3, (40,), generator=torch.Generator().manual_seed(2))
    test_labels = torch.randint(3, (15,), generator=torch.Generator().manual_seed(3))
    correct = 0
    for query, label in zip(test, test_labels.tolist()):
        similarities = train @ query
        nearest = np.argsort(-similarities)[:k]
        votes = [0.0, 0.0, 0.0]
        for j in nearest:
            votes[int(train_labels[j])] += math.exp(similarities[j] / temperature)
        correct += int(np.argmax(votes) == label)
    assert knn_top1(train, train_labels, test, test_labels, k, temperature) == pytest.approx(100 * correct / 15)


def test_retrieval_recall_against_a_loop_with_repeated_captions():
    captions = ["a", "b", "c", "a", "d", "b", "e", "f"]
    images, texts = _unit(8, 5, 4), _unit(8, 5, 5)
    texts[3] = texts[0]  # identical captions embed identically
    texts[5] = texts[1]
    metrics = retrieval_recall(images, texts, captions, ks=(1, 2, 3))
    distinct = ["a", "b", "c", "d", "e", "f"]
    distinct_embeddings = np.stack([texts[captions.index(c)] for c in distinct])
    for k in (1, 2, 3):
        hits = [captions[i] in [distinct[j] for j in np.argsort(-(distinct_embeddings @ images[i]))[:k]]
                for i in range(8)]
        assert metrics[f"image_to_text_recall@{k}"] == pytest.approx(100 * np.mean(hits))
        hits = [captions[i] in [captions[j] for j in np.argsort(-(images @ texts[i]))[:k]] for i in range(8)]
        assert metrics[f"text_to_image_recall@{k}"] == pytest.approx(100 * np.mean(hits))


def test_perfect_embeddings_recall_everything():
    embeddings = _unit(20, 8, 6)
    metrics = retrieval_recall(embeddings, embeddings, [str(i) for i in range(20)])
    assert metrics["image_to_text_recall@1"] == 100.0 and metrics["text_to_image_recall@1"] == 100.0
    assert metrics["chance_image_to_text_recall@1"] == pytest.approx(5.0)


def test_chance_recall_by_enumeration():
    # 6 candidates, 2 of which match: the fraction of 3-subsets of positions that contain a match
    subsets = list(combinations(range(6), 3))
    expected = 100 * sum(any(j < 2 for j in s) for s in subsets) / len(subsets)
    assert chance_recall(np.array([2]), 6, 3) == pytest.approx(expected)


def test_zero_shot_picks_the_nearest_class():
    classes = np.eye(3, dtype=np.float32)
    images = np.array([[0.9, 0.1, 0], [0, 0.2, 0.9], [0.1, 0.95, 0]], dtype=np.float32)
    assert zero_shot_top1(images, torch.tensor([0, 2, 0]), classes) == pytest.approx(200 / 3)


def test_knn_rejects_bad_options():
    with pytest.raises(ValueError, match="k >= 1"):
        knn_top1(_unit(3, 2, 0), torch.zeros(3, dtype=torch.long), _unit(2, 2, 1), torch.zeros(2, dtype=torch.long), 0)
