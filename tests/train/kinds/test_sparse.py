"""`gradcache train text --kind sparse` (SPLADE): a step of the program's strategy against the loss and gradient
computed here from the formula, text by text (float64, every parameter); the program's runs (GradCache and one
full batch train the same model, the loss parts in metrics.json, resume equals an uninterrupted run); and the
dense options it refuses."""
import csv
import json

import pytest
import torch

from gradcache import GradCache
from gradcache.cli import main
from gradcache.models import HuggingFaceTokenizer
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from gradcache.train.modes import TEXT_KINDS
from gradcache.train.strategy_choice import build_strategy
from tests.conftest import assert_grads_close, grads_of, zero
from tests.train.conftest import TINY
from tests.train.kinds.sparse_models import write_tiny_splade

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

QUERIES = ["who bakes bread?", "where is the red mill", "what does ada grow", "who sails"]
PASSAGES = [["the baker bakes bread", "ada grows beans"], ["the red mill stands by the river", "a boat"],
            ["ada grows beans and corn in the valley", "the mill"], ["tom sails the boat", "bread"]]


def sparse_args(model, output_dir, *extra):
    return ["train", "text", "--kind", "sparse", "--model", str(model), *TINY["text"], "--output-dir",
            str(output_dir), *extra]


def reference_loss(model, tokenizer, temperature, document_weight, query_weight):
    """The SPLADE loss from its formula, each text encoded alone (no padding): rows w = max_t log(1 + relu(logits)),
    InfoNCE over <q_i, d_j> / T with d the batch's positives and hard negatives, plus the FLOPS terms."""
    def row(text):
        tokens = tokenizer([text])
        logits = model.query_tower.model(**tokens).logits[0]  # (L, V)
        return torch.log1p(torch.relu(logits)).max(dim=0).values  # (V,)

    queries = torch.stack([row(q) for q in QUERIES])  # (n, V)
    documents = torch.stack([row(p) for group in PASSAGES for p in group])  # (n (1 + h), V)
    loss = 0
    for i, query in enumerate(queries):
        scores = documents @ query / temperature  # (n (1 + h),)
        loss = loss + torch.logsumexp(scores, 0) - scores[i * len(PASSAGES[0])]
    flops = lambda rows: (rows.mean(dim=0) ** 2).sum()  # noqa: E731
    return loss / len(QUERIES) + document_weight * flops(documents) + query_weight * flops(queries), queries


@pytest.mark.parametrize("strategy, chunk_size", [("gradcache", 1), ("gradcache", 3), ("full", None)])
def test_a_step_equals_the_formula_on_every_parameter(tiny_splade, strategy, chunk_size):
    mode = TEXT_KINDS["sparse"]
    config = RunConfig(mode="text", kind="sparse", model=str(tiny_splade), negatives_per_query=1, temperature=0.5,
                       document_regularizer_weight=0.3, query_regularizer_weight=0.2, chunk_size=chunk_size or 4,
                       strategy=strategy, max_length=24)
    torch.manual_seed(0)
    model, loss = mode.build_model(config).double(), mode.build_loss(config).double()
    tokenizer = HuggingFaceTokenizer(tiny_splade, config.max_length)
    run = build_strategy(config, mode.encoders(model), loss, torch.amp.GradScaler("cpu", enabled=False),
                         mode.trim_padding, mode.chunk_sizes(config), mode.sparse_cache)
    if strategy == "gradcache":
        assert isinstance(run, GradCache) and run.options["sparse_cache"]
    zero(model, loss)
    got = run.step(tokenizer(QUERIES), tokenizer([p for group in PASSAGES for p in group]))
    got_grads = grads_of(model, loss)

    zero(model, loss)
    want, queries = reference_loss(model, tokenizer, 0.5, 0.3, 0.2)
    want.backward()
    assert 0 < int((queries == 0).sum()) < queries.numel()  # zeros for the sparse cache to drop, and non-zeros
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    assert all(g is not None for g in grads_of(model).values())  # every parameter of the model learns
    assert_grads_close(got_grads, grads_of(model, loss), 1e-8)
    parts = loss.parts
    assert set(parts) == {"base_loss", "document_regularizer_loss", "query_regularizer_loss"}
    torch.testing.assert_close(sum(parts.values()), want.detach(), rtol=1e-10, atol=1e-12)


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


def test_gradcache_and_one_full_batch_train_the_same_model(tmp_path, tiny_splade, monkeypatch):
    import gradcache.train.run

    built = []
    original = gradcache.train.run.build_strategy
    monkeypatch.setattr(gradcache.train.run, "build_strategy",
                        lambda *args, **kwargs: built.append(original(*args, **kwargs)) or built[-1])
    for strategy in ("gradcache", "full"):
        argv = sparse_args(tiny_splade, tmp_path / strategy, "--strategy", strategy, "--negatives-per-query", "1",
                           "--document-regularizer-weight", "0.01", "--query-regularizer-weight", "0.02")
        assert main(argv) == 0
    assert isinstance(built[0], GradCache) and built[0].options["sparse_cache"]  # the run caches the non-zeros
    cached, full = (load_checkpoint(tmp_path / s)["model"] for s in ("gradcache", "full"))
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-5)
    metrics = json.loads((tmp_path / "gradcache" / "metrics.json").read_text())
    assert metrics["negatives_per_anchor"] == 8 * 2 - 1
    parts = [metrics[f"final_{name}"] for name in ("base_loss", "document_regularizer_loss",
                                                   "query_regularizer_loss")]
    assert all(part > 0 for part in parts) and sum(parts) == pytest.approx(metrics["final_loss"], rel=1e-5)
    assert _losses(tmp_path / "gradcache")[-1][1] == f"{metrics['final_loss']:.6f}"


@pytest.mark.slow
def test_resume_logs_the_same_losses_as_an_uninterrupted_run(tmp_path, killed_after_step):
    """With dropout on, killed after step 3 of 3 (the checkpoint holds step 2), resumed: the same losses, weights
    and scores as one whole run."""
    model = write_tiny_splade(tmp_path / "dropout_splade", dropout=0.1)
    options = ["--steps", "3", "--checkpoint-every", "2", "--test-size", "8"]
    assert main(sparse_args(model, tmp_path / "whole", *options)) == 0
    killed_after_step(3, sparse_args(model, tmp_path / "cut", *options))
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d)["model"] for d in ("whole", "cut"))
    assert any(name.startswith("towers.0.model.cls.") for name in whole)  # the MLM head is trained and saved
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    final = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut")]
    assert final[0]["mrr@10"] == final[1]["mrr@10"] and final[0]["mrr@10_initial"] == final[1]["mrr@10_initial"]


@pytest.mark.slow  # smoke runs of options the library's own tests check; a few seconds each
@pytest.mark.parametrize("options", [
    ["--precision", "bf16", "--grad-checkpointing", "--memory-budget", "1M"],
    ["--strategy", "naive", "--negatives-per-query", "1"],
    ["--fsdp"],
], ids=["bf16-checkpointing-budget", "naive", "fsdp"])
def test_precision_checkpointing_strategies_and_sharding(tmp_path, tiny_splade, options):
    assert main(sparse_args(tiny_splade, tmp_path, *options)) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and 0 <= metrics["mrr@10"] <= 100 and metrics["nonzeros_per_query"] > 0
    assert (tmp_path / ("last.dcp" if "--fsdp" in options else "last.pt")).exists()


@pytest.mark.parametrize("options, named", [
    (["--guide", "all-MiniLM-L6-v2"], "--guide all-MiniLM-L6-v2"),
    (["--matryoshka-dims", "64,32"], "--matryoshka-dims"),
    (["--queue-size", "16"], "--queue-size 16"),
    (["--tile-size", "4"], "--tile-size 4"),
    (["--symmetric"], "--symmetric"),
    (["--pooling", "cls"], "--pooling cls"),
    (["--separate-towers"], "--separate-towers"),
    (["--chunk-tokens", "64"], "--chunk-tokens 64"),
    (["--lora-rank", "4"], "--lora-rank 4"),
    (["--document-regularizer-weight", "-1"], "--document-regularizer-weight"),
])
def test_options_it_cannot_honour_exit_2_and_write_nothing(tmp_path, tiny_splade, capsys, options, named):
    assert main(sparse_args(tiny_splade, tmp_path / "run", *options)) == 2
    err = capsys.readouterr().err
    assert named in err and ("--kind sparse" in err or "at least 0" in err or ">= 0" in err), err
    assert not (tmp_path / "run").exists()


def test_a_model_without_a_masked_lm_head_class_exits_2(tmp_path, capsys):
    from tests.tiny_decoder_model import write_tiny_decoder

    folder = write_tiny_decoder(tmp_path / "decoder")
    assert main(sparse_args(folder, tmp_path / "run")) == 2
    assert "has no masked-language-model head" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
