"""`--queue-size` and `--queue-warmup` in every mode: the queue travels in the checkpoint, so a killed and resumed run
equals an uninterrupted one; the log counts the queue the loss reads; bad values fail before anything is written."""
import csv
import json

import pytest
import torch

import gradcache
from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from tests.train.conftest import text_args


def _column(folder, name):
    with open(folder / "train_log.csv", newline="") as handle:
        return [row[name] for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "queue"), [("simclr", ["--queue-size", "40", "--queue-warmup", "1"]),
                                             ("clip", ["--queue-size", "20", "--strategy", "naive"])])
def test_resume_with_a_queue_equals_an_uninterrupted_run(tmp_path, tiny_args, killed_after_step, mode, queue):
    args = ["--steps", "4", "--checkpoint-every", "2", *queue]
    assert main(tiny_args(mode, tmp_path / "whole", *args)) == 0
    killed_after_step(3, tiny_args(mode, tmp_path / "cut", *args))
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    assert main(["train", mode, "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == 0
    assert _column(tmp_path / "cut", "loss") == _column(tmp_path / "whole", "loss")
    whole, resumed = (load_checkpoint(tmp_path / d) for d in ("whole", "cut"))
    assert any(".rows" in name for name in whole["loss"])  # the queue is in the checkpoint
    for part in ("model", "loss"):
        assert whole[part].keys() == resumed[part].keys()
        for name in whole[part]:
            assert torch.equal(whole[part][name], resumed[part][name]), name


def test_the_log_counts_the_queue_each_step_reads(tmp_path, tiny_args):
    assert main(tiny_args("simclr", tmp_path, "--queue-size", "40", "--queue-warmup", "1", "--steps", "3")) == 0
    in_batch = gradcache.negatives_per_anchor("gradcache", "ntxent", batch_size=16, chunk_size=8)
    # step 1: warm-up; step 2: an empty queue; step 3: the 32 views of step 2; after it: full (40 of 64 views)
    assert [int(n) for n in _column(tmp_path, "negatives_per_anchor")] == [in_batch, in_batch, in_batch + 32]
    assert json.loads((tmp_path / "metrics.json").read_text())["negatives_per_anchor"] == in_batch + 40 == \
        gradcache.negatives_per_anchor("gradcache", "ntxent", 16, 8, queue_size=40)


def test_an_older_checkpoint_trained_without_a_queue():
    stored = RunConfig(queue_size=5, queue_warmup=2).to_dict()
    for name in ("queue_size", "queue_warmup"):
        del stored[name]
    read = RunConfig.from_dict({**stored, "config_version": 3})
    assert (read.queue_size, read.queue_warmup) == (0, 0)


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--queue-size", "-1"], "--queue-size -1"),
    (["--queue-warmup", "3"], "a warm-up needs a queue"),
    (["--queue-size", "8", "--fsdp"], "--queue-size with --fsdp"),
])
def test_bad_queue_options_fail_before_anything_is_written(tmp_path, tiny_args, capsys, extra, fragment):
    assert main(tiny_args("simclr", tmp_path / "out", *extra)) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_text_mode_queues_positives_and_hard_negatives(tmp_path, tiny_bert):
    assert main(text_args(tiny_bert, tmp_path / "run", "--negatives-per-query", "1", "--queue-size", "12")) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["negatives_per_anchor"] == 8 * 2 - 1 + 12  # two steps of 16 passages fill 12 rows
    assert load_checkpoint(tmp_path / "run")["loss"]["infonce.queue.rows"].shape[0] == 12
