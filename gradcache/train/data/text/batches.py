"""The batches of `gradcache train text`: per step, the queries' tokens and their passages' tokens, grouped by query.

Step s takes the rows that the run's StepSampler gives (a function of seed and step, so resume is exact). The
passages of a batch of n queries with h hard negatives each are n (1 + h) texts in query order, each query's
positive first: [p_1, n_1_1 .. n_1_h, p_2, n_2_1 ..]. Grouping by query keeps a chunk of c queries aligned with
a chunk of c (1 + h) passages, so NaiveAccumulation's micro-batches hold whole queries and, under
torch.distributed, the ranks' passages gathered by rank stay grouped by query.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Dataset

from gradcache.train.data.order import StepSampler, step_loader
from gradcache.train.data.text.indexed_pairs import IndexedPairs
from gradcache.train.data.text.text_pairs import TextPairs


class QueryPassages(Dataset):
    """Item (epoch, i): query i and its passages, positive first."""

    def __init__(self, pairs: TextPairs | IndexedPairs) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, item: tuple[int, int]) -> tuple[str, list[str]]:
        _, index = item
        query, positive, negatives = self.pairs.row(index)  # an indexed row is read from its file here
        return query, [positive, *negatives]


class TokenizeGroups:
    """Tokenises a batch of items into [query tokens (n, L), passage tokens (n (1 + h), L')], and with a guide's
    tokenizer the same texts again in the guide's tokens (a class, not a lambda, so worker processes can pickle
    it). `passage_tokenizer` tokenises the passages where they take another prompt than the queries (default:
    `tokenizer`)."""

    def __init__(self, tokenizer: Callable[[list[str]], dict[str, torch.Tensor]],
                 guide_tokenizer: Callable[[list[str]], dict[str, torch.Tensor]] | None = None,
                 passage_tokenizer: Callable[[list[str]], dict[str, torch.Tensor]] | None = None) -> None:
        self.tokenizer, self.guide_tokenizer = tokenizer, guide_tokenizer
        self.passage_tokenizer = tokenizer if passage_tokenizer is None else passage_tokenizer

    def __call__(self, items: list[tuple[str, list[str]]]) -> list[dict[str, torch.Tensor]]:
        queries = [query for query, _ in items]
        passages = [passage for _, group in items for passage in group]
        tokens = [self.tokenizer(queries), self.passage_tokenizer(passages)]
        if self.guide_tokenizer is not None:
            tokens += [self.guide_tokenizer(queries), self.guide_tokenizer(passages)]
        return tokens


def split_groups(passages: torch.Tensor, negatives_per_query: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n (1 + h), D) passage embeddings grouped by query -> positives (n, D) and hard negatives (n h, D) or None."""
    grouped = passages.view(-1, 1 + negatives_per_query, passages.shape[-1])  # (n, 1 + h, D)
    negatives = grouped[:, 1:].reshape(-1, passages.shape[-1]) if negatives_per_query else None  # (n h, D)
    return grouped[:, 0], negatives


def text_batches(pairs: TextPairs | IndexedPairs, sampler: StepSampler, tokenizer: Callable, workers: int,
                 guide_tokenizer: Callable | None = None, passage_tokenizer: Callable | None = None) -> DataLoader:
    """A loader of [query tokens, passage tokens] per step (and the guide's tokens of both, given
    `guide_tokenizer`), in the order `sampler` gives; passages by `passage_tokenizer` (default: `tokenizer`)."""
    return step_loader(QueryPassages(pairs), sampler, TokenizeGroups(tokenizer, guide_tokenizer, passage_tokenizer),
                       workers)
