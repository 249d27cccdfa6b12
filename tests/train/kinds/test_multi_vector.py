"""`gradcache train text --kind multi-vector`: the kind's GradCache step against the MaxSim InfoNCE computed here
text by text (float64, every parameter); the program's GradCache and full-batch runs train the same model (slow); a
killed run resumes with the uninterrupted losses; the options the kind cannot honour exit 2."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from gradcache.train.modes import TEXT_KINDS
from gradcache.train.modes.text_folders import side_tokenizers
from gradcache.train.strategy_choice import build_strategy
from tests.tiny_text_model import write_tiny_bert
from tests.train.conftest import TINY, text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
KIND = ["--kind", "multi-vector", "--token-dim", "8", "--temperature", "1"]  # the peer's scale 1
QUERIES = ["who bakes bread?", "where is the mill", "the river's name", "a"]
PASSAGES = [  # per query: its positive, then its hard negative
    ["the baker bakes bread.", "the smith forges"], ["the mill stands by the river", "no mill here"],
    ["the river is called ada", "a lake, not a river"], ["b", "an unrelated and rather long passage of text"],
]


@pytest.fixture(scope="module")
def dropout_bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("models") / "dropout_bert", dropout=0.1)


def _maxsim(query: torch.Tensor, document: torch.Tensor) -> torch.Tensor:
    """sum_i max_j <q_i, d_j> of one unpadded pair: (n_q, n_d) products, each query token's best, summed."""
    return (query @ document.T).max(dim=1).values.sum()


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_step(loss, got, want_loss, want):
    """The step's loss and every parameter's gradient (the projection's included) equal the reference's."""
    assert torch.allclose(loss.double(), want_loss, rtol=1e-10, atol=0)
    assert got.keys() == want.keys() and "towers.0.projection.weight" in want
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-8, atol=1e-10, msg=name)


@pytest.mark.parametrize("tile_size", [None, 3])
def test_a_gradcache_step_equals_the_maxsim_infonce_of_each_text_alone(tiny_bert, tile_size):
    """Chunks of 2 queries and 4 passages, padding trimmed, against each text encoded alone (no padding at all),
    its tokens scored by loops: loss and the gradient of every parameter (the projection too), float64."""
    kind = TEXT_KINDS["multi-vector"]
    config = RunConfig(mode="text", kind="multi-vector", model=str(tiny_bert), max_length=24, token_dim=8,
                       temperature=0.5, negatives_per_query=1, chunk_size=2, tile_size=tile_size)
    torch.manual_seed(0)
    model = kind.build_model(config).double()
    query_tokens, passage_tokens = side_tokenizers(config)
    passages = [p for group in PASSAGES for p in group]
    strategy = build_strategy(config, kind.encoders(model), kind.build_loss(config).double(), None,
                              kind.trim_padding, kind.chunk_sizes(config))
    loss = strategy.step(query_tokens(QUERIES), passage_tokens(passages))
    got = _grads(model)
    model.zero_grad()

    def alone(tokenizer, text):
        embedded = model.encode_query(**tokenizer([text]))
        assert embedded.mask.all()
        return embedded.values[0]

    queries = [alone(query_tokens, q) for q in QUERIES]
    documents = [alone(passage_tokens, p) for p in [g[0] for g in PASSAGES] + [g[1] for g in PASSAGES]]
    logits = torch.stack([torch.stack([_maxsim(q, d) for d in documents]) for q in queries]) / 0.5
    want_loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(QUERIES)))
    want_loss.backward()
    want = _grads(model)
    assert_same_step(loss, got, want_loss, want)


@pytest.mark.slow
def test_gradcache_and_full_batch_train_the_same_model(tmp_path, tiny_bert):
    for strategy in ("gradcache", "full"):
        argv = text_args(tiny_bert, tmp_path / strategy, *KIND, "--strategy", strategy, "--steps", "3",
                         "--negatives-per-query", "1")
        assert main(argv) == 0
    cached, full = (load_checkpoint(tmp_path / s)["model"] for s in ("gradcache", "full"))
    assert "towers.0.projection.weight" in cached
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-5)
    metrics = json.loads((tmp_path / "gradcache" / "metrics.json").read_text())
    assert metrics["negatives_per_anchor"] == 8 * 2 - 1
    for key in ("recall@1", "recall@10", "mrr@10", "ndcg@10"):
        assert 0 <= metrics[key] <= 100 and 0 <= metrics[f"{key}_initial"] <= 100


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_resume_logs_the_same_losses_as_an_uninterrupted_run(tmp_path, dropout_bert, killed_after_step):
    """Killed after step 3 (the checkpoint holds step 2), resumed: the losses, weights and scores of one whole
    run, dropout on."""
    argv = ["train", "text", *TINY["text"], *KIND, "--max-length", "16", "--model", str(dropout_bert), "--steps",
            "3", "--checkpoint-every", "2", "--negatives-per-query", "1"]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    killed_after_step(3, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert load_checkpoint(tmp_path / "cut")["step"] < 3
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d)["model"] for d in ("whole", "cut"))
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    final = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut")]
    assert final[0]["mrr@10"] == final[1]["mrr@10"]


@pytest.mark.parametrize("option", [["--pooling", "cls"], ["--separate-towers"], ["--symmetric"],
                                    ["--queue-size", "8"], ["--matryoshka-dims", "4"], ["--lora-rank", "2"],
                                    ["--guide", "all-MiniLM-L6-v2"], ["--exclude-prompt-from-pooling"]])
def test_options_the_kind_cannot_honour_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys, option):
    assert main(text_args(tiny_bert, tmp_path / "run", *KIND, *option)) == 2
    err = capsys.readouterr().err
    assert option[0] in err and "does not apply to --kind multi-vector" in err, err
    assert not (tmp_path / "run").exists()


def test_token_dim_of_another_kind_exits_2(tmp_path, tiny_bert, capsys):
    assert main(text_args(tiny_bert, tmp_path / "run", "--token-dim", "8")) == 2
    assert "--token-dim 8 is read by --kind multi-vector alone" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
