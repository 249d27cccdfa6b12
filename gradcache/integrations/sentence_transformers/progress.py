"""tqdm bars over the chunks a GradCache loss encodes, as `CachedMultipleNegativesRankingLoss(show_progress_bar=True)`
shows its mini-batches: one bar for phase (1), run by the loss's call, one for phase (3), run by its backward."""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gradcache.cache import GradCache
from gradcache.inputs import batch_length
from gradcache.token_chunks import token_plan


def chunk_count(strategy: GradCache, value: Any, index: int) -> int | None:
    """How many chunks phase (1) cuts input `index` into (None when its length cannot be read)."""
    tokens = strategy.chunk_tokens_for(index)
    if tokens is not None:
        plan = token_plan(value, tokens, strategy.chunk_size_for(index), strategy.vision_layout(index, value),
                          strategy.trims_leading(index, value))
        return len(plan[1])
    rows = batch_length(value, f"input {index}", hints=strategy.vision_hints(index, value))
    return None if rows is None else math.ceil(rows / strategy.chunk_size_for(index))


class ChunkProgress:
    """Counts encoder calls into a bar for phase (1) while the loss's call runs, and into a bar for phase (3)
    afterwards; does nothing when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._in_call = False
        self._reencoded: int | None = None

    @contextmanager
    def call(self, strategy: GradCache, inputs: Sequence[Any], learning: Sequence[bool]) -> Iterator[None]:
        """Around one call of the loss (phases (1)-(2)): sizes both bars from the inputs' chunk counts."""
        if not self.enabled:
            yield
            return
        from tqdm.auto import tqdm  # a dependency of sentence-transformers

        self._close()
        counts = [chunk_count(strategy, value, i) for i, value in enumerate(inputs)]
        first = None if None in counts else sum(counts)
        kept_ones = strategy.options["memory_budget"] is not None  # kept graphs are not re-encoded: unknown count
        learners = [c for c, learn in zip(counts, learning) if learn]
        self._reencoded = None if kept_ones or None in learners else sum(learners)
        self._bar = tqdm(total=first, desc="GradCache (1) encode chunks", unit="chunk")
        self._in_call = True
        try:
            yield
        finally:
            self._in_call = False
            self._close()

    def tick(self) -> None:
        """One chunk encoded: in phase (1) during the call, in phase (3) after it."""
        if not self.enabled:
            return
        if self._bar is None and not self._in_call:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self._reencoded, desc="GradCache (3) re-encode chunks", unit="chunk")
        if self._bar is not None:
            self._bar.update(1)
            if not self._in_call and self._bar.total is not None and self._bar.n >= self._bar.total:
                self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
