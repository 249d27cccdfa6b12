"""`--matryoshka-dims` in every mode: the step's loss is the sum over widths of the mode's plain loss on the
first d columns, a queue keeps full-width rows, resume stays exact, the metrics come at each width, and bad
widths exit 2 before anything is written."""
import csv
import json

import pytest
import torch
import torch.nn.functional as F

import gradcache.train.run
from gradcache import losses
from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from tests.train.conftest import text_args

DIMS = [16, 8, 4]  # the tiny models' embeddings are 16 wide


@pytest.fixture
def loss_calls(monkeypatch):
    """Every call of the run's loss: (the embeddings it was handed, detached copies; the value it returned)."""
    calls = []
    build = gradcache.train.run.build_loss

    def recording(mode, config):
        loss = build(mode, config)
        loss.register_forward_hook(lambda module, args, value: calls.append(
            ([a.detach().clone() for a in args], value.detach().clone())))
        return loss

    monkeypatch.setattr(gradcache.train.run, "build_loss", recording)
    return calls


def _column(folder, name, log="train_log.csv"):
    with open(folder / log, newline="") as handle:
        return [row[name] for row in csv.DictReader(handle)]


def _grouped(query, passages, h):
    """passages (n (1 + h), D) grouped by query -> positives (n, D), hard negatives (n h, D) or None."""
    grouped = passages.view(query.shape[0], 1 + h, -1)
    return grouped[:, 0], grouped[:, 1:].reshape(-1, passages.shape[1]) if h else None


def _plain_sum(mode, embeddings, temperature, h=1):
    """The reference: the mode's plain loss on the first d columns, summed over DIMS, in float64."""
    total = 0.0
    for dim in DIMS:
        cut = [e[:, :dim].double() for e in embeddings]
        if mode == "simclr":
            total += losses.NTXent(temperature=temperature)(*cut)
        elif mode == "clip":
            total += losses.ClipLoss(temperature=temperature)(*cut)
        else:
            total += losses.InfoNCE(temperature=temperature)(cut[0], *_grouped(cut[0], cut[1], h))
    return total


@pytest.mark.parametrize("mode", ["simclr", "clip", "text"])
def test_a_matryoshka_run_trains_each_width_and_scores_it(tmp_path, tiny_args, tiny_bert, loss_calls, mode):
    dims = ["--matryoshka-dims", ",".join(map(str, DIMS)), "--temperature", "0.07"]
    argv = (text_args(tiny_bert, tmp_path, "--negatives-per-query", "1", *dims) if mode == "text"
            else tiny_args(mode, tmp_path, *dims))
    assert main(argv) == 0
    embeddings, value = loss_calls[0]  # step 1's loss over the whole batch (GradCache calls it once a step)
    torch.testing.assert_close(value.double(), _plain_sum(mode, embeddings, 0.07), rtol=1e-5, atol=1e-6)
    assert float(_column(tmp_path, "loss")[0]) == pytest.approx(value.item(), abs=1e-6)

    metrics = json.loads((tmp_path / "metrics.json").read_text())
    with open(tmp_path / "eval_log.csv", newline="") as handle:
        eval_columns = next(csv.reader(handle))
    full = {"simclr": "knn_top1", "clip": "image_to_text_recall@1", "text": "mrr@10"}[mode]
    widths = DIMS if mode == "simclr" else DIMS[1:]  # SimCLR: kNN of the projection at every width (its knn_top1
    for dim in widths:                               # is on the backbone); the others: every width but the full
        assert f"{full}@{dim}" in eval_columns and 0 <= metrics[f"{full}@{dim}"] <= 100
    assert f"{full}@16" in metrics if mode == "simclr" else f"{full}@16" not in metrics
    assert not any(key.startswith("chance_") and key.count("@") > 1 for key in metrics)


def test_a_text_run_with_a_queue_equals_its_reference(tmp_path, tiny_bert, loss_calls):
    """The queue holds the full-width positives and hard negatives of step 1, each width reads its prefix."""
    assert main(text_args(tiny_bert, tmp_path, "--negatives-per-query", "1", "--queue-size", "12",
                          "--matryoshka-dims", ",".join(map(str, DIMS)))) == 0
    (first, first_value), (second, second_value) = loss_calls
    query, passages = second
    positive, negatives = _grouped(query, passages, 1)
    queued = torch.cat(_grouped(*first, 1))[-12:]  # step 1's 16 candidates, the last 12 kept
    want = 0.0
    for dim in DIMS:  # from the formula: each query against [positives; hard negatives; queue], its own positive
        columns = F.normalize(torch.cat([positive, negatives, queued])[:, :dim].double(), dim=1)
        logits = F.normalize(query[:, :dim].double(), dim=1) @ columns.T / 0.05  # (8, 8 + 8 + 12)
        want = want + F.cross_entropy(logits, torch.arange(8))
    torch.testing.assert_close(second_value.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first_value.double(), _plain_sum("text", first, 0.05), rtol=1e-5, atol=1e-6)
    assert load_checkpoint(tmp_path)["loss"]["infonce.loss.queue.rows"].shape == (12, 16)  # one full-width queue


@pytest.mark.slow
def test_resume_of_a_matryoshka_run_equals_an_uninterrupted_run(tmp_path, tiny_args, killed_after_step):
    args = ["--steps", "4", "--checkpoint-every", "2", "--matryoshka-dims", "16,8", "--queue-size", "40"]
    assert main(tiny_args("simclr", tmp_path / "whole", *args)) == 0
    killed_after_step(3, tiny_args("simclr", tmp_path / "cut", *args))
    assert main(["train", "simclr", "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == 0
    assert _column(tmp_path / "cut", "loss") == _column(tmp_path / "whole", "loss")
    whole, resumed = (load_checkpoint(tmp_path / d) for d in ("whole", "cut"))
    for part in ("model", "loss"):
        for name in whole[part]:
            assert torch.equal(whole[part][name], resumed[part][name]), name
    final = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut")]
    assert final[0]["knn_top1@8"] == final[1]["knn_top1@8"]


@pytest.mark.parametrize(("dims", "fragment"), [
    ("16,16", "strictly decreasing; give --matryoshka-dims 16"),
    ("8,16", "strictly decreasing; give --matryoshka-dims 16,8"),
    ("32,16", "32 is larger than the model's embedding width 16"),
    ("16,0", "at least 1"),
    ("16,a", "is not a comma-separated list of ints"),
])
def test_bad_dims_exit_2_naming_the_option_before_anything_is_written(tmp_path, tiny_args, capsys, dims, fragment):
    assert main(tiny_args("simclr", tmp_path / "out", "--matryoshka-dims", dims)) == 2
    err = capsys.readouterr().err
    assert "--matryoshka-dims" in err and fragment in err, err
    assert not (tmp_path / "out").exists()


def test_text_dims_are_checked_against_the_model_folders_width(tmp_path, tiny_bert, capsys):
    assert main(text_args(tiny_bert, tmp_path / "out", "--matryoshka-dims", "24,8")) == 2
    assert "24 is larger than the model's embedding width 16" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_older_checkpoint_trained_without_matryoshka_or_a_guide():
    stored = RunConfig(mode="text", matryoshka_dims=[8, 4], guide="g", guide_margin=0.1).to_dict()
    for name in ("matryoshka_dims", "guide", "guide_margin", "guide_margin_strategy"):
        del stored[name]
    read = RunConfig.from_dict({**stored, "config_version": 7})
    assert (read.matryoshka_dims, read.guide, read.guide_margin, read.guide_margin_strategy) == \
        (None, None, 0.0, "absolute")
