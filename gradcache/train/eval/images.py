"""Held-out evaluation with faiss: weighted kNN (SimCLR), cross-modal recall@K and zero-shot top-1 (CLIP).

All scores are percentages. Embeddings are L2-normalised, so a faiss inner-product index ranks by cosine.

- kNN (Wu et al. 2018, as lightly's benchmarks run it): the k nearest training embeddings of a test embedding
  vote for their class with weight exp(cos / t); the class with the largest sum is the prediction.
- Recall@K: a query is a hit when one of its K nearest candidates carries the query's own caption. Image to
  text ranks the DISTINCT captions (identical captions are one candidate, not rival ones); text to image ranks
  all images, any image of that caption counting. `chance_recall` gives the expected score of a random ranking.
- Zero-shot: each class is the mean normalised embedding of its prompts; an image takes its nearest class.
"""
from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from gradcache.train.data.images.augment import to_model_input


def pixel_features(train: torch.Tensor, test: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Raw-pixel baseline features: flattened pixels, centred on the training mean, L2-normalised."""
    flat_train = to_model_input(train).flatten(1)
    mean = flat_train.mean(0, keepdim=True)
    return (F.normalize(flat_train - mean, dim=1).numpy(),
            F.normalize(to_model_input(test).flatten(1) - mean, dim=1).numpy())


def _search(index_vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    index = faiss.IndexFlatIP(index_vectors.shape[1])
    index.add(np.ascontiguousarray(index_vectors, dtype=np.float32))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, index_vectors.shape[0]))


def knn_top1(train_embeddings: np.ndarray, train_labels: torch.Tensor, test_embeddings: np.ndarray,
             test_labels: torch.Tensor, k: int = 200, temperature: float = 0.1) -> float:
    """Weighted kNN accuracy (%): sum over the k neighbours of exp(cos / temperature) per class, argmax."""
    if k < 1 or temperature <= 0:
        raise ValueError(f"kNN needs k >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    similarities, neighbours = _search(train_embeddings, test_embeddings, k)  # (M, k) each
    votes = torch.as_tensor(train_labels)[torch.as_tensor(neighbours)]  # (M, k) class of each neighbour
    weights = torch.exp(torch.as_tensor(similarities, dtype=torch.float64) / temperature)  # (M, k)
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    scores = torch.zeros(len(votes), num_classes, dtype=torch.float64).scatter_add_(1, votes, weights)  # (M, C)
    return 100.0 * (scores.argmax(1) == torch.as_tensor(test_labels)).double().mean().item()


def _caption_ids(captions: Sequence[str]) -> tuple[np.ndarray, list[int]]:
    """For each caption the index of its distinct caption, and the first position of each distinct one."""
    first: dict[str, int] = {}
    ids = np.array([first.setdefault(c, len(first)) for c in captions])
    positions: dict[int, int] = {}
    for position, caption_id in enumerate(ids.tolist()):
        positions.setdefault(caption_id, position)
    return ids, [positions[i] for i in range(len(first))]


def chance_recall(matches_per_query: np.ndarray, candidates: int, k: int) -> float:
    """Expected recall@k (%) of a random ranking: 1 - C(n - m, k) / C(n, k), averaged over queries."""
    miss = np.ones(len(matches_per_query))
    for j in range(min(k, candidates)):
        miss *= np.clip(candidates - matches_per_query - j, 0, None) / (candidates - j)
    return 100.0 * float((1 - miss).mean())


def retrieval_recall(image_embeddings: np.ndarray, caption_embeddings: np.ndarray, captions: Sequence[str],
                     ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """image_to_text_recall@K, text_to_image_recall@K and their `chance_` counterparts (%), pair i = image i."""
    ids, distinct = _caption_ids(captions)
    metrics: dict[str, float] = {}
    _, text_ranks = _search(caption_embeddings[distinct], image_embeddings, max(ks))  # (N, K) distinct captions
    _, image_ranks = _search(image_embeddings, caption_embeddings, max(ks))  # (N, K) images
    per_caption = np.bincount(ids)
    for k in ks:
        metrics[f"image_to_text_recall@{k}"] = 100.0 * float((text_ranks[:, :k] == ids[:, None]).any(1).mean())
        metrics[f"text_to_image_recall@{k}"] = 100.0 * float((ids[image_ranks[:, :k]] == ids[:, None]).any(1).mean())
        metrics[f"chance_image_to_text_recall@{k}"] = chance_recall(np.ones(len(ids)), len(distinct), k)
        metrics[f"chance_text_to_image_recall@{k}"] = chance_recall(per_caption[ids], len(ids), k)
    return metrics


def zero_shot_top1(image_embeddings: np.ndarray, labels: torch.Tensor, class_embeddings: np.ndarray) -> float:
    """Accuracy (%) of assigning each image the class whose (C, D) prompt embedding is nearest."""
    _, nearest = _search(class_embeddings, image_embeddings, 1)
    return 100.0 * float((nearest[:, 0] == np.asarray(labels)).mean())
