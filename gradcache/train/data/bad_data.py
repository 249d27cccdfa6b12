"""Bad-data accounting for every mode: what was left out, and the share of bad items a run allows.

- `SkippedRows`: the rows (items) left out, counted, with the reasons of the first few kept for the warning.
- `check_bad_share`: at start, refuse data of which more than --max-bad-share could not be used.
- `BadShare`: as the run goes, the items read and those that could not be used; more than --max-bad-share of
  them, once at least `BAD_SHARE_MIN_READS` were read, raises `TooMuchBadData`.
- `CountedBatches`: the batches of a loader whose collate also says what it read and what failed, counted in a
  `BadShare`.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gradcache.train.errors import TooMuchBadData

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

BAD_SHARE_MIN_READS = 1_000  # --max-bad-share is checked once at least this many images (rows) were read
SHOWN_SKIPS = 10  # reasons a warning names


class SkippedRows(Sequence[str]):
    """The rows left out: `len` is how many, the items are the reasons of the first `keep` (all when None)."""

    def __init__(self, count: int = 0, reasons: list[str] | None = None, keep: int | None = SHOWN_SKIPS) -> None:
        self.count, self.reasons, self.keep = count, list(reasons or []), keep

    def add(self, reason: str) -> None:
        self.count += 1
        if self.keep is None or len(self.reasons) < self.keep:
            self.reasons.append(reason)

    def extend(self, reasons: list[str]) -> None:
        for reason in reasons:
            self.add(reason)

    def merge(self, later: SkippedRows) -> None:
        """Add the rows `later` left out, met after these: its count, and its reasons while there is room."""
        room = len(later.reasons) if self.keep is None else max(self.keep - len(self.reasons), 0)
        self.count += later.count
        self.reasons.extend(later.reasons[:room])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, item):
        return self.reasons[item]

    def __iter__(self) -> Iterator[str]:
        return iter(self.reasons)

    def summary(self, total: int, where: str) -> str:
        """The warning that names them: 'skipped N of `total` rows of `where`: ' and the first SHOWN_SKIPS reasons."""
        shown = "; ".join(self.reasons[:SHOWN_SKIPS]) + (" ..." if self.count > SHOWN_SKIPS else "")
        return f"skipped {self.count} of {total} rows of {where}: {shown}"


def check_bad_share(skipped: list[str], kept: int, max_share: float, items: str) -> None:
    """Refuse data of which more than `max_share` of the entries (`kept` loaded, `skipped` left out) are bad."""
    total = kept + len(skipped)
    if total and len(skipped) > max_share * total:
        shown = "; ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        raise TooMuchBadData(f"{len(skipped)} of {total} {items} ({len(skipped) / total:.1%}) could not be used, more "
                             f"than --max-bad-share {max_share:g} allows ({shown}); repair the data, or raise "
                             "--max-bad-share to train on the rest")


class BadShare:
    """The `items` (images, rows) read by a run so far and the names of those that could not be used (`failure`
    says how: images "failed to decode"); refuses more than `max_share` bad among them once at least `min_reads`
    were read (--max-bad-share, counted as the run goes). `skipped` is the run's list (or `SkippedRows`)."""

    def __init__(self, max_share: float, skipped: list[str], min_reads: int | None = None, items: str = "images",
                 failure: str = "failed to decode") -> None:
        self.max_share, self.skipped, self.items, self.failure = max_share, skipped, items, failure
        self.min_reads = BAD_SHARE_MIN_READS if min_reads is None else min_reads
        self.read = self.bad = 0
        self.last = ""

    def add(self, read: int, failed: list[str]) -> None:
        """Count `read` items of which `failed` could not be used (their names go to `skipped`).

        Raises:
            TooMuchBadData: at least `min_reads` read, and more than `max_share` of them bad.
        """
        if failed and self.bad < 10:
            warnings.warn(f"skipped {self.items} that {self.failure}: {', '.join(failed[:10 - self.bad])}",
                          stacklevel=2)
        self.read += read
        self.bad += len(failed)
        self.skipped.extend(failed)
        self.last = failed[-1] if failed else self.last
        if self.read >= self.min_reads and self.bad > self.max_share * self.read:
            raise TooMuchBadData(f"{self.bad} of the {self.read} {self.items} read so far ({self.bad / self.read:.1%}) "
                                 f"{self.failure}, more than --max-bad-share {self.max_share:g} allows (last: "
                                 f"{self.last}); repair the data, or raise --max-bad-share to train on the rest")


class CountedBatches:
    """The batches of a loader whose collate returns (batch, items read, names failed): yields the batches and
    counts the rest in `bad_share` (`BadShare`: the run's skipped items, --max-bad-share as the run goes)."""

    def __init__(self, loader: DataLoader, bad_share: BadShare) -> None:
        self.loader, self.bad_share = loader, bad_share

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        for batch, read, failed in self.loader:
            self.bad_share.add(read, failed)
            yield batch
