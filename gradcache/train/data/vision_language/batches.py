"""The batches of `gradcache train vlm`: per step, the queries' batch and their passages' batch, each the model's
processor's (the collator's), the passages grouped by query as the text mode's GroupedInfoNCE reads them:
[p_1, n_1_1 .. n_1_h, p_2, n_2_1 ..] (data/text/batches.py).

Step s takes the rows the run's `StepSampler` gives (a function of seed and step: resume is exact). A row's images
open when it is drawn, in the loader's workers (opened_input.py). A row with an image that cannot be used (a
path leaving the root, a FIFO, a decompression bomb, an aspect past 200, a truncated file) is replaced by the next
row in order that opens, i + 1, i + 2, ... (mod N): a function of i alone, so the batches stay a function of
(seed, step) whatever the workers. Each is counted as bad data (data/bad_data.py's `BadShare`: named in a warning,
added to the training rows' `skipped`, and more than --max-bad-share of the rows read, once `BAD_SHARE_MIN_READS`
were read, stops the run with `TooMuchBadData`, naming the share and the last one).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import Dataset

from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput
from gradcache.train.config import RunConfig
from gradcache.train.data.bad_data import BadShare, CountedBatches
from gradcache.train.data.images.row_images import BadRowImage
from gradcache.train.data.images.training_batches import Drawn
from gradcache.train.data.order import StepSampler, step_loader
from gradcache.train.data.vision_language.lengths import refused_length
from gradcache.train.data.vision_language.opened_input import opened_row
from gradcache.train.data.vision_language.rows import VisionLanguageRow, VisionLanguageSplits
from gradcache.train.data.worker_failures import ReadingFailed
from gradcache.train.errors import DataError

OpenedRow = tuple[str, VisionLanguageInput, list[VisionLanguageInput]]  # where, query, [positive, *negatives]


class OpenedRows(Dataset):
    """Item (epoch, i): row i opened, or the next row that opens (module docstring); a batch's items come as a
    `Drawn` with the rows read and the names of those that could not be used."""

    def __init__(self, rows: Sequence[VisionLanguageRow], root: Path | None) -> None:
        self.rows, self.root = rows, root

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, items: list[tuple[int, int]]) -> Drawn:
        drawn = Drawn()
        for item in items:
            drawn.append(self._draw(item, drawn))
        return drawn

    def __getitem__(self, item: tuple[int, int]) -> OpenedRow:
        return self._draw(item, Drawn())

    def _draw(self, item: tuple[int, int], drawn: Drawn) -> OpenedRow:
        _, index = item
        for step in range(len(self.rows)):
            row = self.rows[(index + step) % len(self.rows)]
            drawn.read += 1
            try:
                query, passages = opened_row(row, self.root)
            except BadRowImage as error:
                drawn.failed.append(f"{row.where} ({error})")
                continue
            except Exception as error:  # no image's way of failing: the run stops, naming the row
                raise ReadingFailed(row.where) from error
            return row.where, query, passages
        first = drawn.failed[0] if drawn.failed else self.rows[0].where
        raise DataError(f"no training row's images can be used ({len(self.rows)} rows; the first: {first}); check "
                        "the images and --image-root")


class CollateRows:
    """A batch of opened rows -> ((query batch, passage batch), rows read, names that failed); the collator's
    refusal of a row longer than --max-length becomes a DataError naming the row (a class, so workers can pickle
    it)."""

    def __init__(self, collator: VisionLanguageCollator) -> None:
        self.collator = collator

    def __call__(self, items: Drawn):
        queries = [query for _, query, _ in items]
        passages = [passage for _, _, group in items for passage in group]
        query_rows = [where for where, _, _ in items]
        passage_rows = [where for where, _, group in items for _ in group]
        try:
            query_batch = self.collator.queries(queries)
        except ValueError as error:
            raise refused_length(self.collator, query_rows, queries, False, error) from error
        try:
            passage_batch = self.collator.passages(passages)
        except ValueError as error:
            raise refused_length(self.collator, passage_rows, passages, True, error) from error
        return (query_batch, passage_batch), items.read, items.failed


def vision_language_batches(config: RunConfig, data: VisionLanguageSplits, sampler: StepSampler,
                            collator: VisionLanguageCollator) -> CountedBatches:
    """One (query batch, passage batch) per step of `sampler` (module docstring), read by --workers processes; the
    rows whose images cannot be used counted in `data.train.skipped` and against --max-bad-share."""
    loader = step_loader(OpenedRows(data.train, data.image_root), sampler, CollateRows(collator), config.workers)
    return CountedBatches(loader, BadShare(config.max_bad_share, data.train.skipped, items="rows",
                                           failure="had an image that could not be used"))
