"""Held-out retrieval of a vision-language embedder, both ways over the held-out (query, positive) rows, each side
a text, its images or both, embedded as one input:

- `query_to_positive_*`: each row's query ranks the distinct positives of the held-out rows;
- `positive_to_query_*`: each row's positive ranks the distinct queries.

Each direction's metrics are `retrieval_metrics`' (eval/retrieval.py: recall@1, recall@10, mrr@10, ndcg@10 in
percent), with its one relevant candidate per row. On the built-in shapes the held-out queries are images and the
positives their captions: image to text, then text to image.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import numpy as np
import torch

from gradcache.models import VisionLanguageInput
from gradcache.train.data.vision_language import RowSide, VisionLanguageRow, opened_input
from gradcache.train.data.vision_language.stored_images import StoredImage
from gradcache.train.eval.retrieval import retrieval_metrics

DIRECTIONS = ("query_to_positive", "positive_to_query")
EVAL_BATCH = 64  # inputs opened and embedded at a time


def side_key(side: RowSide) -> Hashable:
    """What makes two sides one candidate: the same text and the same image values (a path, datasets' bytes or, left
    in their file, their digest; an image in memory, the built-in data's, by its identity), under the same root."""
    images = tuple(value if isinstance(value, (str, Path)) else
                   (value.path, value.digest) if isinstance(value, StoredImage) else
                   (value.get("path"), value.get("bytes")) if isinstance(value, dict) else id(value)
                   for value in side.images)
    return side.text, images, side.root


def distinct(sides: Sequence[RowSide]) -> tuple[list[RowSide], np.ndarray]:
    """The distinct `sides` (`side_key`) in first-seen order, and (N,) the place of each side among them."""
    index: dict[Hashable, int] = {}
    kept: list[RowSide] = []
    for side in sides:
        if index.setdefault(side_key(side), len(kept)) == len(kept):
            kept.append(side)
    return kept, np.array([index[side_key(side)] for side in sides], dtype=np.int64)


def embedded(embed: Callable[[list[VisionLanguageInput], str], torch.Tensor], sides: Sequence[RowSide],
             image_root: Path | None, tower: str) -> np.ndarray:
    """(N, D) float32 embeddings of `sides` as the `tower` side ("query" or "passage"), their images opened
    `EVAL_BATCH` at a time."""
    parts = [embed([opened_input(side, image_root) for side in sides[start:start + EVAL_BATCH]], tower)
             for start in range(0, len(sides), EVAL_BATCH)]
    return torch.cat(parts).float().cpu().numpy()


def evaluate_vision_language_retrieval(embed: Callable[[list[VisionLanguageInput], str], torch.Tensor],
                                       rows: Sequence[VisionLanguageRow], image_root: Path | None) -> dict[str, float]:
    """The module docstring's metrics of the held-out `rows` (`VisionLanguageRow`s), each side embedded by
    `embed(inputs, tower)` (`LoadedModel.embed_inputs`' contract: L2-normalised (B, D))."""
    queries, query_of = distinct([row.query for row in rows])
    positives, positive_of = distinct([row.positive for row in rows])
    query_vectors = embedded(embed, queries, image_root, "query")
    positive_vectors = embedded(embed, positives, image_root, "passage")
    metrics: dict[str, float] = {}
    for direction, asked, candidates, relevant in (
            ("query_to_positive", query_vectors[query_of], positive_vectors, positive_of),  # (N, D), (P, D)
            ("positive_to_query", positive_vectors[positive_of], query_vectors, query_of)):  # (N, D), (Q, D)
        metrics.update({f"{direction}_{key}": value
                        for key, value in retrieval_metrics(asked, candidates, relevant).items()})
    return metrics
