"""Rows too long for --max-length (data/vision_language/lengths.py): refused at start from a sample, naming the
row, its length (image tokens included) and the --max-length that fits; one met later stops the loader by name.
Nothing is truncated."""
from __future__ import annotations

import pytest
import torch

from gradcache.models.vision_language_collator import VisionLanguageCollator
from gradcache.train.data.order import StepSampler
from gradcache.train.data.vision_language import (
    check_vision_language_lengths, load_vision_language_splits, vision_language_batches,
)
from gradcache.train.data.vision_language.opened_input import opened_input
from gradcache.train.errors import DataError, UsageError
from tests.train.data.vision_language.row_files import png, vlm_config, write_rows
from tests.vlm_models import tiny_qwen2_vl

LONG = "<image> a cat sits on the mat " + "the red dog " * 6 + "<image>"


@pytest.fixture(scope="module")
def processor():
    torch.set_num_threads(1)
    return tiny_qwen2_vl()[1]


def _length(processor, side, root, passage: bool) -> tuple[int, int]:
    """(tokens, image tokens) of one opened side, from an unbounded collator: the reference."""
    collator = VisionLanguageCollator(processor)
    opened = opened_input(side, root)
    batch = collator.passages([opened]) if passage else collator.queries([opened])
    return int(batch["attention_mask"].sum()), int(batch["input_ids"].eq(collator.image_token_id).sum())


def _rows(tmp_path, long_at: int, count: int = 6):
    png(tmp_path / "a.png", 80, 60)
    png(tmp_path / "b.png", 60, 80, seed=1)
    rows = [{"query": "a cat", "positive": "the mat", "positive_image": "a.png"} for _ in range(count)]
    rows[long_at] = {"query": "a dog", "positive": LONG, "positive_image": ["a.png", "b.png"]}
    return write_rows(tmp_path / "rows.jsonl", rows)


def test_a_row_too_long_is_refused_at_start_naming_it(tmp_path, processor):
    path = _rows(tmp_path, long_at=4)
    config = vlm_config(path, eval_data=str(path))
    splits = load_vision_language_splits(config)
    tokens, image_tokens = _length(processor, splits.train[4].positive, splits.image_root, passage=True)
    short, _ = _length(processor, splits.train[0].positive, splits.image_root, passage=True)
    assert image_tokens > 0 and short < tokens
    collator = VisionLanguageCollator(processor, max_length=tokens - 1)
    with pytest.raises(UsageError, match=rf"rows.jsonl line 5: its positive holds {tokens} tokens \({image_tokens} of "
                                         rf"them image tokens\), more than --max-length {tokens - 1}; pass "
                                         rf"--max-length {tokens} .*--max-pixels"):
        check_vision_language_lengths(vlm_config(path, eval_data=str(path), max_length=tokens - 1), splits, collator)
    check_vision_language_lengths(vlm_config(path, eval_data=str(path), max_length=tokens), splits, collator)


def test_a_row_too_long_past_the_sample_stops_the_loader_naming_it(tmp_path, processor):
    path = _rows(tmp_path, long_at=70, count=72)
    held = write_rows(tmp_path / "held.jsonl", [{"query": "a", "positive": "b"}])
    splits = load_vision_language_splits(vlm_config(path, eval_data=str(held)))
    tokens, _ = _length(processor, splits.train[70].positive, splits.image_root, passage=True)
    config = vlm_config(path, eval_data=str(held), max_length=tokens - 1)
    collator = VisionLanguageCollator(processor, max_length=tokens - 1)
    check_vision_language_lengths(config, splits, collator)  # row 71 is past the sample
    sampler = StepSampler(len(splits.train), len(splits.train), 0, 0, 1)
    with pytest.raises(DataError, match=rf"rows.jsonl line 71: its passage holds {tokens} tokens"):
        list(vision_language_batches(config, splits, sampler, collator))
