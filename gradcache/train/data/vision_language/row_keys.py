"""Which fields of a record make a vision-language row (`RowKeys`), and the check that each key names a field.

- Text: `--query-key`, `--positive-key`, `--negative-keys` (the text mode's options). Images: `--query-image-key`
  (default `query_image`), `--positive-image-key` (`positive_image`), `--negative-image-keys` (default: the field
  `negative_images` where the rows have it, else none).
- A key left at its default may name no field: a side is then text only or image only (image-only queries need
  no `query` column). A key given (not its default) that names no field is refused (DataError naming the option,
  the key and the columns there are), and so is a side of which neither key names a field.
"""
from __future__ import annotations

from dataclasses import dataclass

from gradcache.train.config import RunConfig
from gradcache.train.data.text.usable_rows import warn_unused_negatives
from gradcache.train.errors import DataError, UsageError

NEGATIVE_IMAGES = "negative_images"  # the field of negatives' images when --negative-image-keys is not given


@dataclass(frozen=True)
class RowKeys:
    """The fields of each side: its text key and its image key; the negatives' text keys and image keys."""

    query: str
    positive: str
    negatives: tuple[str, ...]
    query_image: str
    positive_image: str
    negative_images: tuple[str, ...]

    def columns(self) -> tuple[str, str, tuple[str, ...]]:
        """Every field to read, as a text format's `records(file, keys)` takes them (query, positive, the rest)."""
        return self.query, self.positive, (*self.negatives, self.query_image, self.positive_image,
                                           *self.negative_images)


def row_keys(config: RunConfig, names: set) -> RowKeys:
    """The keys of `config` over rows whose fields are `names`: the negatives' images `negative_images` when
    --negative-image-keys is not given and the rows have that field.

    Raises:
        UsageError: --negatives-per-query above 0 with neither --negative-keys nor negative images.
    """
    negative_images = (tuple(config.negative_image_keys) if config.negative_image_keys is not None
                       else (NEGATIVE_IMAGES,) if NEGATIVE_IMAGES in names else ())
    keys = RowKeys(config.query_key, config.positive_key, tuple(config.negative_keys or ()), config.query_image_key,
                   config.positive_image_key, negative_images)
    if config.negatives_per_query and not keys.negatives and not keys.negative_images:
        raise UsageError(f"--negatives-per-query {config.negatives_per_query} needs hard negatives: name their "
                         "texts with --negative-keys or their images with --negative-image-keys (or give the rows a "
                         f"{NEGATIVE_IMAGES!r} field)")
    return keys


def check_row_columns(names: set, keys: RowKeys, where: str) -> None:
    """Refuse (DataError) a key given that names no field of `names` (the rows of `where`), and a side of which
    neither the text key nor the image key names one; warn of columns named like hard negatives that no
    --negative-keys names (`UnusedNegatives`, as the text mode warns)."""
    warn_unused_negatives(names, (keys.query, keys.positive, keys.negatives), where)
    defaults = {"--query-key": RunConfig.query_key, "--positive-key": RunConfig.positive_key,
                "--query-image-key": RunConfig.query_image_key, "--positive-image-key": RunConfig.positive_image_key}
    given = [("--query-key", keys.query), ("--positive-key", keys.positive), ("--query-image-key", keys.query_image),
             ("--positive-image-key", keys.positive_image), *[("--negative-keys", key) for key in keys.negatives],
             *[("--negative-image-keys", key) for key in keys.negative_images]]
    columns = sorted(names, key=str)
    for flag, key in given:
        if key not in names and defaults.get(flag) != key:
            raise DataError(f"{where} has no column {key!r} (columns: {columns}); name the column with {flag}")
    for side, text_key, image_key in (("query", keys.query, keys.query_image),
                                      ("positive", keys.positive, keys.positive_image)):
        if text_key not in names and image_key not in names:
            raise DataError(f"{where} has neither a {side} text column {text_key!r} nor a {side} image column "
                            f"{image_key!r} (columns: {columns}); name one with --{side}-key or --{side}-image-key")
