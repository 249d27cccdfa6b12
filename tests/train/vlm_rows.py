"""Rows for `gradcache train vlm` on the tiny VLM folders of tests/vlm_models.py: a JSONL of rows with PNG paths
beside it, cycling the kinds a VLM embedder trains on: text -> image, image -> text, image + text -> text, and text
-> text (the words of the tiny models' tokenizers)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.train.data.vision_language.row_files import png
from tests.vlm_models import TEXTS

# the tiny folders' processors resize to at least 56 x 56; a few shapes so the rows' patch counts differ
SIZES = ((56, 56), (112, 56), (56, 84))


def write_png_rows(folder: Path, count: int, seed: int = 0) -> Path:
    """`count` rows in `folder`/rows.jsonl (keys query, positive, query_image, positive_image), their images
    `folder`/images/<k>.png; returns the JSONL's path."""
    lines = []
    for k in range(count):
        width, height = SIZES[k % len(SIZES)]
        image = png(folder / "images" / f"{k}.png", width, height, seed + k).relative_to(folder).as_posix()
        text, other = TEXTS[k % len(TEXTS)], TEXTS[(k + 3) % len(TEXTS)]
        lines.append(json.dumps(({"query": text, "positive_image": image},
                                 {"query_image": image, "positive": text},
                                 {"query": other, "query_image": image, "positive": text},
                                 {"query": other, "positive": text})[k % 4]))
    path = folder / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
