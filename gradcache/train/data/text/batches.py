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
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gradcache import losses
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


class GroupedInfoNCE(nn.Module):
    """InfoNCE(query (n, D), passages (n (1 + h), D) grouped by query, positive first): every query against every
    positive and hard negative of the batch, over all ranks when the strategy gathers them.

    With a guide (GISTEmbed, `--guide`): `guide_query` (n, D') and `guide_passages` (n (1 + h), D'), the guide
    model's embeddings of the same texts, drop from each query's softmax the candidates the guide scores above
    g(q_i, p_i) - margin (`margin_strategy` "absolute") or g(q_i, p_i) - |g(q_i, p_i)| margin ("relative").
    `infonce` is the InfoNCE, or a `Matryoshka` around it (`--matryoshka-dims`)."""

    def __init__(self, negatives_per_query: int, temperature: float, *, symmetric: bool = False,
                 tile_size: int | None = None, queue_size: int = 0, queue_warmup: int = 0,
                 margin_strategy: str = "absolute", margin: float = 0.0) -> None:
        super().__init__()
        self.negatives_per_query = negatives_per_query
        self.infonce = losses.InfoNCE(temperature=temperature, symmetric=symmetric, tile_size=tile_size,
                                      queue_size=queue_size, queue_warmup=queue_warmup,
                                      margin_strategy=margin_strategy, margin=margin)

    @property
    def temperature(self) -> float:
        inner = self.infonce.loss if isinstance(self.infonce, losses.Matryoshka) else self.infonce
        return inner.temperature

    def forward(self, query: torch.Tensor, passages: torch.Tensor, guide_query: torch.Tensor | None = None,
                guide_passages: torch.Tensor | None = None) -> torch.Tensor:
        if passages.shape[0] != query.shape[0] * (1 + self.negatives_per_query):
            raise ValueError(f"passages must hold {1 + self.negatives_per_query} rows per query (positive and "
                             f"{self.negatives_per_query} hard negatives), got {passages.shape[0]} for "
                             f"{query.shape[0]} queries")
        positive, negatives = split_groups(passages, self.negatives_per_query)  # (n, D), (n h, D) or None
        if guide_query is None:
            return self.infonce(query, positive, negatives)
        guide_positive, guide_negatives = split_groups(guide_passages, self.negatives_per_query)  # (n, D'), ...
        guide = (guide_query, guide_positive) + (() if guide_negatives is None else (guide_negatives,))
        return self.infonce(query, positive, negatives, guide=guide)


def text_batches(pairs: TextPairs | IndexedPairs, sampler: StepSampler, tokenizer: Callable, workers: int,
                 guide_tokenizer: Callable | None = None, passage_tokenizer: Callable | None = None) -> DataLoader:
    """A loader of [query tokens, passage tokens] per step (and the guide's tokens of both, given
    `guide_tokenizer`), in the order `sampler` gives; passages by `passage_tokenizer` (default: `tokenizer`)."""
    return step_loader(QueryPassages(pairs), sampler, TokenizeGroups(tokenizer, guide_tokenizer, passage_tokenizer),
                       workers)
