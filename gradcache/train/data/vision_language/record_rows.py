"""One record (a JSON object, a table row) as a vision-language row, or why it cannot train.

- A side (query, positive) is its text field and its image field: text only, image only or both. A text is a
  string or null (stripped; empty is none); an image value is a path string, datasets' `{"bytes", "path"}`
  mapping, or a list of them (several images, in order); null, "" or [] is none. Any other type leaves the row
  out, naming the column and the type (a number is never read as a path).
- Hard negatives: their texts from `--negative-keys` as the text mode reads them (each column one negative, a
  list-valued field one negative per item); their images from the negative image keys: one key holds one
  negative's image value per item of its list (an item that is itself a list: that negative's several images),
  or one negative's value when it is no list; several keys hold one negative each. Negative i is the i-th text
  with the i-th image value: text only, image only or both where one list is longer; a negative with neither is
  dropped. A row keeps its first h (`with_negatives`) and is left out with fewer.
- A side whose text holds `<image>` placeholders needs one per image (the images fill them in order); without
  any, its images go before its text (models/vision_language_collator.py). Another count leaves the row out.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gradcache.models.vision_language_collator import PLACEHOLDER
from gradcache.train.data.vision_language.row_keys import RowKeys
from gradcache.train.data.vision_language.rows import RowSide, VisionLanguageRow
from gradcache.train.data.vision_language.stored_images import StoredImage


class Unusable(ValueError):
    """Why a record cannot be a row (the message names the column); the row is skipped and counted."""


def record_row(record: dict, keys: RowKeys, where: str, root: Path | None = None) -> VisionLanguageRow:
    """The row of `record` (`where` names it) with every negative it has; `root`: its sides' image root when it is
    not the splits' (rows.py's `RowSide.root`).

    Raises:
        Unusable: a field of the wrong type, a side with neither text nor image, or placeholders that do not
            match the images.
    """
    query = _side(record, keys.query, keys.query_image, root)
    positive = _side(record, keys.positive, keys.positive_image, root)
    for name, side in (("query", query), ("positive", positive)):
        if side.empty:
            raise Unusable(f"no {name}: neither text in {getattr(keys, name)!r} nor an image in "
                           f"{getattr(keys, name + '_image')!r}")
    texts = _negative_texts(record, keys.negatives)
    images = _negative_images(record, keys.negative_images)
    negatives = []
    for index in range(max(len(texts), len(images))):
        side = RowSide(texts[index] if index < len(texts) else None, images[index] if index < len(images) else (),
                       root)
        if not side.empty:
            _check_placeholders(side, f"hard negative {index + 1}")
            negatives.append(side)
    return VisionLanguageRow(query, positive, tuple(negatives), where)


def with_negatives(row: VisionLanguageRow, negatives_per_query: int) -> VisionLanguageRow:
    """`row` with its first h hard negatives.

    Raises:
        Unusable: it has fewer.
    """
    if len(row.negatives) < negatives_per_query:
        raise Unusable(f"{len(row.negatives)} of {negatives_per_query} hard negatives")
    return replace(row, negatives=row.negatives[:negatives_per_query])


def _side(record: dict, text_key: str, image_key: str, root: Path | None) -> RowSide:
    side = RowSide(_text(record.get(text_key), text_key), image_values(record.get(image_key), image_key), root)
    _check_placeholders(side, text_key)
    return side


def _text(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unusable(f"column {key!r} holds {type(value).__name__}, not text")
    return value.strip() or None


def image_values(value: Any, key: str) -> tuple[Any, ...]:
    """The image values of one field's value, in order (module docstring); none for null, "" or [].

    Raises:
        Unusable: a value that is neither a path, nor `{"bytes", "path"}`, nor a list of them.
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    images = []
    for item in items:
        if item is None or item == "":
            continue
        if isinstance(item, StoredImage):  # bytes left in their file (stored_images.py)
            images.append(item)
        elif isinstance(item, Mapping):
            if item.get("bytes") is None and not item.get("path"):
                continue  # datasets' empty image
            if not isinstance(item.get("bytes"), (bytes, bytearray, type(None))) or not isinstance(
                    item.get("path"), (str, type(None))):
                raise Unusable(f"column {key!r} holds a mapping that is not {{'bytes': bytes, 'path': str}}")
            images.append(dict(item))
        elif isinstance(item, str):
            images.append(item)
        else:
            raise Unusable(f"column {key!r} holds {type(item).__name__}, not an image path or "
                           "{'bytes': ..., 'path': ...}")
    return tuple(images)


def _negative_texts(record: dict, keys: tuple[str, ...]) -> list[str | None]:
    texts: list[str | None] = []
    for key in keys:
        value = record.get(key)
        texts.extend(_text(item, key) for item in (value if isinstance(value, list) else [value]))
    return texts


def _negative_images(record: dict, keys: tuple[str, ...]) -> list[tuple[Any, ...]]:
    if len(keys) == 1:
        value = record.get(keys[0])
        if isinstance(value, (list, tuple)):
            return [image_values(item, keys[0]) for item in value]
        return [image_values(value, keys[0])] if value not in (None, "") else []
    return [image_values(record.get(key), key) for key in keys]


def _check_placeholders(side: RowSide, name: str) -> None:
    placeholders = (side.text or "").count(PLACEHOLDER)
    if placeholders and placeholders != len(side.images):
        raise Unusable(f"{name!r} holds {placeholders} {PLACEHOLDER} placeholders for {len(side.images)} images; "
                       f"give one {PLACEHOLDER} per image, or none to put the images before the text")
