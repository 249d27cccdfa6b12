"""The batches of `gradcache train vlm` (data/vision_language/batches.py): one (query batch, passage batch) per
step, the passages grouped by query as GroupedInfoNCE reads them, the same whatever the workers; a row whose image
is hostile (a decompression bomb, a 1 x 2,000,000 strip, a path out of the root, a FIFO, a truncated PNG) replaced
by the next that opens and counted as bad data, quickly and without a memory blow-up; past --max-bad-share the
run stops."""
from __future__ import annotations

import dataclasses
import os
import struct
import time
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from gradcache.models.vision_language_collator import VisionLanguageCollator
from gradcache.train.data.order import StepSampler
from gradcache.train.data.vision_language import load_vision_language_splits, vision_language_batches
from gradcache.train.data.vision_language.opened_input import opened_input
from gradcache.train.errors import DataError, TooMuchBadData
from tests.train.data.vision_language.row_files import png, vlm_config, write_rows
from tests.vlm_models import tiny_qwen2_vl


@pytest.fixture(scope="module")
def collator():
    torch.set_num_threads(1)
    _, processor = tiny_qwen2_vl()
    return VisionLanguageCollator(processor, max_length=64)


def _equal(first, second) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


def test_batches_group_passages_by_query_and_do_not_depend_on_the_workers(tmp_path, collator):
    rows = []
    for k in range(12):
        png(tmp_path / f"{k}.png", 8 + k % 3, 8, seed=k)
        query = {"query": "a cat"} if k % 3 else {"query_image": f"{k}.png"}
        rows.append({**query, "positive": "the red mat", "positive_image": f"{(k + 1) % 12}.png" if k % 2 else None,
                     "negatives": ["a dog"], "negative_images": [f"{(k + 5) % 12}.png"]})
    path = write_rows(tmp_path / "rows.jsonl", rows)
    config = vlm_config(path, test_size=2, negative_keys=["negatives"])
    splits = load_vision_language_splits(config)
    assert splits.negatives_per_query == 1

    def sampler():
        return StepSampler(len(splits.train), 4, seed=3, start_step=1, total_steps=5)

    by_process = list(vision_language_batches(config, splits, sampler(), collator))
    by_worker = list(vision_language_batches(dataclasses.replace(config, workers=1), splits, sampler(), collator))
    assert len(by_process) == len(by_worker) == 4
    for step, ((queries, passages), (worker_queries, worker_passages), drawn) in enumerate(
            zip(by_process, by_worker, sampler())):
        rows, root = [splits.train[index] for _, index in drawn], splits.image_root
        want_queries = collator.queries([opened_input(row.query, root) for row in rows])
        want_passages = collator.passages([opened_input(side, root) for row in rows
                                           for side in (row.positive, *row.negatives)])  # [p_1, n_1, p_2, n_2 ..]
        assert _equal(queries, want_queries) and _equal(passages, want_passages), step
        assert _equal(queries, worker_queries) and _equal(passages, worker_passages), step
        assert queries["input_ids"].shape[0] == 4 and passages["input_ids"].shape[0] == 8


def _png_bytes(width: int, height: int) -> bytes:
    """A bilevel PNG of `width` x `height` black pixels, written row by row: a few KB for millions of pixels."""
    row = b"\x00" + bytes((width + 7) // 8)  # filter byte, then the packed bits

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    pixels = b"".join(compressor.compress(row * min(4096, height - start)) for start in range(0, height, 4096))
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels + compressor.flush())
            + chunk(b"IEND", b""))


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads the peak memory from /proc")
def test_hostile_images_are_replaced_counted_quickly_and_cheaply(tmp_path, collator):
    root = tmp_path / "data"
    (root / "bomb.png").parent.mkdir()
    (root / "bomb.png").write_bytes(_png_bytes(8_000, 8_000))  # 64 MP: 576 MiB to decode and keep as RGB
    (root / "strip.png").write_bytes(_png_bytes(1, 2_000_000))
    whole = png(tmp_path / "whole.png", 64, 64).read_bytes()
    (root / "cut.png").write_bytes(whole[: len(whole) // 2])
    os.mkfifo(root / "fifo.png")
    png(tmp_path / "outside.png")
    deep = np.random.default_rng(0).integers(0, 65536, (9, 7), dtype=np.uint16)
    Image.fromarray(deep).save(root / "deep.png")  # 16-bit: scaled to 8 bits, a good image
    assert max((root / name).stat().st_size for name in ("bomb.png", "strip.png")) < 20_000
    hostile = ["bomb.png", "strip.png", "../outside.png", "fifo.png", "cut.png"]
    rows = []
    for k, name in enumerate(hostile):
        png(root / f"good{k}.png", seed=k)
        rows += [{"query": "a cat", "positive_image": name}, {"query": "a dog", "positive_image": f"good{k}.png"}]
    rows.append({"query": "the mat", "positive_image": "deep.png"})
    path = write_rows(root / "rows.jsonl", rows)
    held = write_rows(root / "held.jsonl", [{"query": "a", "positive_image": "good0.png"}])
    config = vlm_config(path, eval_data=str(held), max_bad_share=1.0)
    splits = load_vision_language_splits(config)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak resident size starts again from the present one
    before, start = _peak_rss_kib(), time.monotonic()
    with pytest.warns(UserWarning, match="had an image that could not be used"):
        batches = list(vision_language_batches(config, splits, StepSampler(len(rows), len(rows), 0, 0, 1), collator))
    elapsed, grown = time.monotonic() - start, _peak_rss_kib() - before
    assert elapsed < 20, f"{elapsed:.1f} s"
    assert grown < 1024 * 1024, f"{grown / 1024:.0f} MiB more"
    (queries, passages), = batches
    assert queries["input_ids"].shape[0] == passages["input_ids"].shape[0] == len(rows)
    skipped = list(splits.train.skipped)
    assert len(skipped) == len(hostile)
    for line, (name, cause) in enumerate(zip(hostile, ["MiB an image may take", "aspect ratio past 200",
                                                       "leaves the image root", "not a regular file",
                                                       "does not decode"])):
        found = [reason for reason in skipped if reason.startswith(f"rows.jsonl line {2 * line + 1} ")]
        assert len(found) == 1 and cause in found[0], (name, skipped)


def test_past_max_bad_share_the_run_stops_naming_the_share(tmp_path, collator):
    png(tmp_path / "good.png")
    rows = [{"query": "a cat", "positive_image": "good.png" if k == 0 else "../elsewhere.png"} for k in range(10)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    config = vlm_config(path, eval_data=str(path), max_bad_share=0.05)
    with pytest.warns(UserWarning, match="left out 9 of 10 held-out"):
        splits = load_vision_language_splits(config)
    batches = vision_language_batches(config, splits, StepSampler(10, 8, 0, 0, 500), collator)
    with pytest.warns(UserWarning), pytest.raises(TooMuchBadData, match=r"rows read so far \(\d+\.\d%\) had an "
                                                                        r"image.*--max-bad-share 0.05.*elsewhere"):
        for _ in batches:
            pass


def test_no_row_that_opens_is_refused(tmp_path, collator):
    png(tmp_path / "held.png")
    path = write_rows(tmp_path / "rows.jsonl", [{"query": "q", "positive_image": "../x.png"}] * 4)
    held = write_rows(tmp_path / "held.jsonl", [{"query": "q", "positive_image": "held.png"}])
    config = vlm_config(path, eval_data=str(held), max_bad_share=1.0)
    splits = load_vision_language_splits(config)
    with pytest.raises(DataError, match="no training row's images can be used"):
        list(vision_language_batches(config, splits, StepSampler(4, 2, 0, 0, 1), collator))
