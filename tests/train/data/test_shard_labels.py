"""A webdataset `KEY.cls` is a class index only when it is a non-negative integer below MAX_SHARD_CLASSES: any
other is a bad sample (skipped, counted, the member named), never a class list of its length nor a negative
index in the kNN evaluation. CLIP never reads `.cls`: a bad one leaves its image-caption pair in."""
import io

import pytest
import torch
from PIL import Image

from gradcache.train.data.images.shards import MAX_SHARD_CLASSES, decode_head, find_shards
from gradcache.train.errors import DataError, exit_status_of
from tests.train.shard_files import write_shard

GOOD = [b"0", b"1", b" 2\n"]
BAD = [b"99999999999", b"-5", b"cat", str(MAX_SHARD_CLASSES).encode(), b"1.5"]


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (value, value, value)).save(out, format="PNG")
    return out.getvalue()


def _shard(tmp_path, labels):
    samples = [(f"s{i:03d}", {"png": _png(i), "txt": f"caption {i}".encode(), "cls": label})
               for i, label in enumerate(labels)]
    write_shard(tmp_path / "part-000.tar", samples)
    return find_shards(str(tmp_path / "part-000.tar"))


def test_a_bad_class_is_a_bad_sample_naming_its_member(tmp_path):
    shards = _shard(tmp_path, [*GOOD, *BAD])
    skipped = []
    with pytest.warns(UserWarning, match=f"skipped {len(BAD)} reference samples") as caught:
        data = decode_head(shards, len(GOOD) + len(BAD), 8, captions=False, what="reference", skipped=skipped)
    assert data.labels.tolist() == [0, 1, 2] and data.class_names == ["0", "1", "2"]
    assert len(skipped) == len(BAD)
    for number, label in enumerate(BAD, start=len(GOOD)):
        assert any(f"s{number:03d}.cls" in reason and repr(label.decode()) in reason for reason in skipped)
    assert f"[0, {MAX_SHARD_CLASSES})" in str(caught[0].message)


def test_only_bad_classes_leave_nothing_to_evaluate_and_exit_2(tmp_path):
    shards = _shard(tmp_path, BAD)
    with pytest.warns(UserWarning), pytest.raises(DataError) as caught:
        decode_head(shards, len(BAD), 8, captions=False, what="held-out", skipped=[])
    assert exit_status_of(caught.value) == 2 and "part-000.tar" in str(caught.value)


def test_clip_never_reads_the_class(tmp_path):
    shards = _shard(tmp_path, [*GOOD, *BAD])
    data = decode_head(shards, len(GOOD) + len(BAD), 8, captions=True, what="held-out", skipped=[])
    assert data.captions == [f"caption {i}" for i in range(len(GOOD) + len(BAD))]
    assert data.labels is None and torch.equal(data.images[3], data.images[3])
