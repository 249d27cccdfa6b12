"""CheckpointMeta: the typed record beside a checkpoint's tensors, written and read by one module, of any version."""
import pytest

from gradcache.train.checkpoints.meta import META_VERSION, CheckpointMeta
from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError


def _meta() -> CheckpointMeta:
    return CheckpointMeta(config=RunConfig(mode="clip", batch_size=64), step=7, total_steps=20, epoch=1,
                          batch_in_epoch=3, scheduler={"last_epoch": 7}, scaler={"scale": 1.0},
                          random_state={"torch": "state"}, elapsed_s=12.5, baselines={"chance": 1.0},
                          initial={"recall@1": 2.0})


def test_round_trip():
    stored = _meta().to_dict()
    assert stored["meta_version"] == META_VERSION
    assert CheckpointMeta.from_dict(stored) == _meta()


def test_a_checkpoint_from_before_the_version_reads_with_what_it_lacked_filled_in():
    """Version 0: the dict literal of earlier programs, with a `signature` nothing read and, in the first
    versions, no step-0 metrics."""
    stored = {k: v for k, v in _meta().to_dict().items() if k not in ("meta_version", "initial")}
    stored["signature"] = {"mode": "clip"}
    read = CheckpointMeta.from_dict(stored)
    assert read.initial == {} and read.step == 7 and read.config == _meta().config


def test_a_newer_or_an_incomplete_record_is_refused_naming_the_checkpoint():
    with pytest.raises(CheckpointError, match="newer gradcache"):
        CheckpointMeta.from_dict({**_meta().to_dict(), "meta_version": META_VERSION + 1}, "RUN/last.pt")
    stored = _meta().to_dict()
    del stored["scaler"]
    with pytest.raises(CheckpointError, match=r"RUN/last.pt lacks \['scaler'\]"):
        CheckpointMeta.from_dict(stored, "RUN/last.pt")


def test_the_stored_keys_are_the_fields_and_older_records_fill_in_what_they_lack():
    """The file's keys, pinned: every field once (the options under "args"), read back by the same list."""
    assert list(_meta().to_dict()) == ["meta_version", "args", "step", "total_steps", "epoch", "batch_in_epoch",
                                       "scheduler", "scaler", "random_state", "elapsed_s", "baselines", "initial"]
    stored = {k: v for k, v in _meta().to_dict().items() if k not in ("epoch", "batch_in_epoch", "initial")}
    read = CheckpointMeta.from_dict(stored)
    assert (read.epoch, read.batch_in_epoch, read.initial) == (0, 0, {})
    required = {k: v for k, v in _meta().to_dict().items() if k != "meta_version"}
    for key in ("args", "step", "total_steps", "scheduler", "scaler", "random_state", "elapsed_s", "baselines"):
        with pytest.raises(CheckpointError, match=rf"lacks \['{key}'\]"):
            CheckpointMeta.from_dict({k: v for k, v in required.items() if k != key})
