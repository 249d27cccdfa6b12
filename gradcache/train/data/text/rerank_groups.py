"""The batches of `gradcache train text --kind cross-encoder`: per step, each query's group of (query, candidate)
pairs (their listwise loss: `GroupedRerank`, gradcache/train/modes/grouped_rerank.py).

A batch of n queries with h hard negatives each and k in-batch negatives gives n G pairs, G = 1 + k + h, grouped
by query: query i's positive, then k candidates of the other rows of the batch, then its h hard negatives (the
order of the columns of sentence-transformers' cross-encoder `CachedMultipleNegativesRankingLoss`). The k are
drawn as that loss draws them (`get_in_batch_negatives`): `torch.multinomial` without replacement over the n (1 +
h) candidates of the batch that are not the query's own (positives first, then each hard-negative column), from a
generator seeded by (seed, epoch, the batch's first row), so a step draws the same whatever the process, worker
or resume. Under torch.distributed each rank draws among its own rows, as the peer draws on each device.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from gradcache.train.data.order import StepSampler, epoch_seed, step_loader
from gradcache.train.data.text.indexed_pairs import IndexedPairs
from gradcache.train.data.text.text_pairs import TextPairs

Pair = tuple[str, str]


def group_size(in_batch_negatives: int, hard_negatives: int, rows: int) -> int:
    """G = 1 + k + h pairs per query, k = `in_batch_negatives` cut to the (rows - 1) (1 + h) candidates of the
    `rows` - 1 other rows of a rank's batch (the peer takes them all when it asks for as many or more)."""
    return 1 + min(in_batch_negatives, (rows - 1) * (1 + hard_negatives)) + hard_negatives


class RowsWithPlace(Dataset):
    """Item (epoch, i): ((epoch, i), query i, its candidates, positive first)."""

    def __init__(self, pairs: TextPairs | IndexedPairs) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, item: tuple[int, int]) -> tuple[tuple[int, int], str, list[str]]:
        query, positive, negatives = self.pairs.row(item[1])  # an indexed row is read from its file here
        return item, query, [positive, *negatives]


def draw_in_batch(candidates: list[list[str]], count: int, generator: torch.Generator) -> list[list[str]]:
    """For each of the n rows, `count` candidates of the other rows, by the peer's rule (module docstring).

    Args:
        candidates: C columns of n texts each: the positives, then each hard-negative column.
        count: k, candidates drawn per row; all of the others ((n - 1) C) when k is not below their count.
        generator: the draw's random state.

    Returns: n lists of k (or (n - 1) C) texts, row i's in the order drawn.
    """
    rows, columns = len(candidates[0]), len(candidates)
    if count == 0:
        return [[] for _ in range(rows)]
    flattened = [text for column in candidates for text in column]  # (n C,), column after column
    mask = ~torch.eye(rows, dtype=torch.bool).repeat(1, columns)  # (n, n C): False at a row's own candidates
    if count < len(flattened) - columns:
        indices = torch.multinomial(mask.float(), count, generator=generator)  # (n, k), without replacement
    else:
        indices = torch.arange(rows * columns).repeat(rows, 1)[mask].reshape(rows, -1)  # (n, (n - 1) C)
    return [[flattened[k] for k in row] for row in indices.tolist()]


class GroupPairs:
    """Collates a batch of items into [the n G (query, candidate) pairs, grouped by query] (a class, not a lambda,
    so worker processes can pickle it)."""

    def __init__(self, in_batch_negatives: int, seed: int) -> None:
        self.in_batch_negatives, self.seed = in_batch_negatives, seed

    def __call__(self, items: list[tuple[tuple[int, int], str, list[str]]]) -> list[list[Pair]]:
        (epoch, first), _, _ = items[0]
        generator = torch.Generator().manual_seed((epoch_seed(self.seed, epoch) * 1_000_003 + first) % 2**63)
        queries = [query for _, query, _ in items]
        columns = [list(column) for column in zip(*(group for _, _, group in items))]  # C columns of n texts
        drawn = draw_in_batch(columns, self.in_batch_negatives, generator)
        pairs = [(query, candidate) for query, group, others in zip(queries, (g for _, _, g in items), drawn)
                 for candidate in (group[0], *others, *group[1:])]
        return [pairs]


def rerank_batches(pairs: TextPairs | IndexedPairs, sampler: StepSampler, in_batch_negatives: int,
                   workers: int) -> DataLoader:
    """A loader of [n G (query, candidate) pairs] per step, in the order `sampler` gives (module docstring)."""
    return step_loader(RowsWithPlace(pairs), sampler, GroupPairs(in_batch_negatives, sampler.seed), workers)
