"""Raw (query, candidate) text pairs as a GradCache input, split into chunks of pairs that the encoder tokenises
itself (`gradcache.PairScorer`), so the N (1 + k) pairs of a reranking batch are never tokenised all at once."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["TextPairs", "split_pairs"]


class TextPairs(Sequence[tuple[str, str]]):
    """A batch of (query, candidate) string pairs, one example each; slicing gives `TextPairs` again.

    GradCache passes each chunk whole to the encoder (`encoder(chunk)`); give `split_fn=split_pairs` to cut it.

    Args:
        pairs: a non-empty sequence of (query, candidate) tuples or lists of two strings.

    Raises:
        TypeError: pairs that are not a sequence, or an entry that is not two strings (named by its index).
        ValueError: no pairs.

    Example:
        >>> pairs = TextPairs([("what is a cat", "a small feline"), ("what is a cat", "a bridge")])
        >>> GradCache(PairScorer(model, tokenizer), ListwiseRerank(), 16, split_fn=split_pairs).step(pairs, group_size=2)
    """

    def __init__(self, pairs: Sequence[Sequence[str]]) -> None:
        if isinstance(pairs, TextPairs):
            self._pairs: list[tuple[str, str]] = list(pairs)
            return
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
            raise TypeError(
                f"pairs must be a list of (query, candidate) string tuples, got {type(pairs).__name__}"
            )
        checked = []
        for k, pair in enumerate(pairs):
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(text, str) for text in pair)):
                raise TypeError(
                    f"pairs[{k}] must be a (query, candidate) tuple of two strings, got {pair!r}; give one pair "
                    "per example, e.g. [('what is a cat', 'a small feline'), ...]"
                )
            checked.append((pair[0], pair[1]))
        if not checked:
            raise ValueError("pairs is empty; a batch needs at least one (query, candidate) pair")
        self._pairs = checked

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> TextPairs: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | TextPairs:
        if isinstance(index, slice):
            return TextPairs(self._pairs[index])
        return self._pairs[index]

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._pairs)

    def __repr__(self) -> str:
        return f"TextPairs({len(self)} pairs)"

    @property
    def queries(self) -> list[str]:
        return [query for query, _ in self._pairs]

    @property
    def candidates(self) -> list[str]:
        return [candidate for _, candidate in self._pairs]


def split_pairs(pairs: TextPairs, chunk_size: int) -> list[TextPairs]:
    """`split_fn` for `TextPairs`: consecutive chunks of `chunk_size` pairs (the last may be shorter)."""
    if not isinstance(pairs, TextPairs):
        raise TypeError(
            f"split_pairs splits TextPairs, got {type(pairs).__name__}; wrap the list: TextPairs(pairs)"
        )
    return [pairs[start : start + chunk_size] for start in range(0, len(pairs), chunk_size)]
