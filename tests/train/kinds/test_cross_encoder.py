"""`gradcache train text --kind cross-encoder` on a tiny BERT written by the test: the batch's groups and their
in-batch draw (against sentence-transformers' own draw), one step of every strategy against a full-batch step of
the brute-force loss (float64, every parameter), the logged loss of the program against that reference, resume,
the reranking metrics against a brute-force ranking, and RUN/model loaded by sentence-transformers' CrossEncoder."""
import copy
import csv
import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache.cli import main  # noqa: E402
from gradcache.train.checkpoints.atomic import load_checkpoint  # noqa: E402
from gradcache.train.config import RunConfig  # noqa: E402
from gradcache.train.data.order import StepSampler, epoch_order  # noqa: E402
from gradcache.train.data.text.rerank_groups import draw_in_batch  # noqa: E402
from gradcache.train.eval.reranking import RERANK_OTHERS, evaluate_reranking, rerank_candidates  # noqa: E402
from gradcache.train.eval.retrieval import retrieval_corpus  # noqa: E402
from gradcache.train.modes import mode_of  # noqa: E402
from gradcache.train.strategy_choice import build_strategy  # noqa: E402
from tests.tiny_text_model import write_tiny_bert  # noqa: E402
from tests.train.conftest import TINY  # noqa: E402

METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")
KIND = ["--kind", "cross-encoder", "--threads", "1"]  # one thread: tiny models gain nothing from more


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def dropout_bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("models") / "dropout_bert", dropout=0.1)


def _config(model, **changes) -> RunConfig:
    values = dict(mode="text", kind="cross-encoder", model=str(model), data="world", train_size=32, test_size=16,
                  batch_size=6, chunk_size=1, negatives_per_query=1, max_length=24, temperature=0.1,
                  in_batch_negatives=3, seed=3)
    return RunConfig(**{**values, **changes})


def _first_batch(config):
    mode = mode_of(config)
    data = mode.load_data(config)
    config = mode.resolve(config, data)
    sampler = StepSampler(len(data.train), config.batch_size, config.seed, 0, 1)
    (pairs,) = next(iter(mode.batches(config, data, sampler)))
    return config, data, pairs


def _reference_loss(scores, group, temperature):
    """The peer's loss from its formula, group by group: -log softmax(sigmoid(s) / t) at the positive."""
    total = 0
    for start in range(0, len(scores), group):
        logits = torch.sigmoid(scores[start:start + group]) / temperature
        total = total - (logits[0] - torch.logsumexp(logits, dim=0))
    return total / (len(scores) // group)


def test_the_draw_is_the_peers():
    """draw_in_batch from a generator seeded s draws what sentence-transformers' draw does after manual_seed(s)."""
    from gradcache.integrations.sentence_transformers.cross_encoder import in_batch_negatives

    columns = [[f"p{i}" for i in range(5)], [f"n{i}" for i in range(5)]]
    for count in (1, 4, 7, 8, 20):
        ours = draw_in_batch(columns, count, torch.Generator().manual_seed(11))
        torch.manual_seed(11)
        theirs = in_batch_negatives([f"q{i}" for i in range(5)], columns, count)  # one column per negative
        assert ours == [list(row) for row in zip(*theirs)]


def test_groups_hold_each_querys_positive_drawn_and_hard_negatives(tiny_bert):
    config, data, pairs = _first_batch(_config(tiny_bert))
    group = mode_of(config).group_size(config)
    assert group == 1 + 3 + 1 and len(pairs) == config.batch_size * group
    rows = epoch_order(len(data.train), config.seed, 0)[:config.batch_size].tolist()
    for i, row in enumerate(rows):
        query, positive, negatives = data.train.row(row)
        own = pairs[i * group:(i + 1) * group]
        assert all(q == query for q, _ in own)
        assert own[0][1] == positive and [c for _, c in own[-1:]] == negatives
        others = [data.train.row(r) for r in rows if r != row]
        pool = [text for _, p, n in others for text in (p, *n)]
        drawn = [c for _, c in own[1:4]]
        assert all(text in pool for text in drawn) and len(set(drawn)) == 3


@pytest.mark.parametrize("strategy,chunk,budget", [("gradcache", 1, None), ("gradcache", 4, None),
                                                   ("gradcache", 1, 10**9), ("naive", 2, None), ("full", 1, None)])
def test_a_step_equals_the_full_batch_reference(tiny_bert, strategy, chunk, budget):
    """Every strategy's gradient on every parameter equals plain autograd through the brute-force loss on all the
    pairs at once (float64); whole groups per chunk make naive accumulation exact too."""
    config, _, pairs = _first_batch(_config(tiny_bert, strategy=strategy, chunk_size=chunk, memory_budget=budget))
    mode = mode_of(config)
    torch.manual_seed(0)
    model = mode.build_model(config).double()
    reference = copy.deepcopy(model)
    loss = mode.build_loss(config)
    cache = build_strategy(config, mode.encoders(model), loss, torch.amp.GradScaler("cpu", enabled=False),
                           mode.trim_padding, mode.chunk_sizes(config))
    value = cache.step(pairs)
    want = _reference_loss(reference(pairs), mode.group_size(config), config.temperature)
    want.backward()
    assert value.item() == pytest.approx(want.item(), rel=1e-10)
    got, expected = dict(model.named_parameters()), dict(reference.named_parameters())
    assert got.keys() == expected.keys()
    for name, parameter in expected.items():
        torch.testing.assert_close(got[name].grad, parameter.grad, rtol=1e-8, atol=1e-12, msg=name)


@pytest.mark.slow
def test_the_programs_first_loss_is_the_reference(tmp_path, tiny_bert):
    """The run's logged loss at step 1 is the brute-force loss of its initial model (seeded as the run seeds it)
    on its first batch."""
    config = _config(tiny_bert)
    argv = ["train", "text", *KIND, "--model", str(tiny_bert), "--train-size", "32", "--test-size", "16",
            "--batch-size", "6", "--chunk-size", "1", "--negatives-per-query", "1", "--max-length", "24",
            "--temperature", "0.1", "--in-batch-negatives", "3", "--seed", "3", "--steps", "1", "--quiet",
            "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    config, _, pairs = _first_batch(config)
    mode = mode_of(config)
    torch.manual_seed(config.seed)
    with torch.no_grad():
        want = _reference_loss(mode.build_model(config)(pairs), mode.group_size(config), config.temperature)
    with open(tmp_path / "train_log.csv", newline="") as handle:
        logged = float(next(csv.DictReader(handle))["loss"])
    assert logged == pytest.approx(want.item(), abs=2e-6)


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_resume_equals_an_uninterrupted_run(tmp_path, dropout_bert, killed_after_step):
    """Killed after step 3 (the checkpoint at step 2), resumed: the same losses, weights and scores, dropout on."""
    argv = ["train", "text", *KIND, *TINY["text"], "--model", str(dropout_bert), "--negatives-per-query", "1",
            "--steps", "5", "--checkpoint-every", "2", "--max-length", "16", "--test-size", "8"]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    killed_after_step(3, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert load_checkpoint(tmp_path / "cut")["step"] < 3
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet", "--threads", "1"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d)["model"] for d in ("whole", "cut"))
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    final = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut")]
    assert final[0]["mrr@10"] == final[1]["mrr@10"]


def test_candidates_follow_the_seeded_rule(tiny_bert):
    _, data, _ = _first_batch(_config(tiny_bert))
    pool, _ = retrieval_corpus(data.test)
    candidates = rerank_candidates(data.test, seed=5)
    assert candidates == rerank_candidates(data.test, seed=5) and candidates != rerank_candidates(data.test, seed=6)
    for texts, positive, negatives in zip(candidates, data.test.positives, data.test.negatives):
        own = list(dict.fromkeys((positive, *negatives)))
        assert texts[:len(own)] == own and len(set(texts)) == len(texts) and set(texts) <= set(pool)
        assert len(texts) == len(own) + min(RERANK_OTHERS, len(pool) - len(own))


@pytest.mark.slow
def test_metrics_equal_a_brute_force_ranking(tiny_bert):
    """Each query's candidates scored together, ranked by counting (ties against the positive), metrics from the
    ranks by their formulas."""
    config, data, _ = _first_batch(_config(tiny_bert, test_size=24))
    torch.manual_seed(1)
    model = mode_of(config).build_model(config).eval()
    got = evaluate_reranking(model, data.test, seed=config.data_seed, batch_size=7)
    ranks = []
    with torch.no_grad():
        for query, texts in zip(data.test.queries, rerank_candidates(data.test, config.data_seed)):
            scores = model([(query, text) for text in texts]).tolist()  # one query's candidates at once
            ranks.append(1 + sum(score >= scores[0] for score in scores[1:]))
    ranks = np.array(ranks)
    want = {"recall@1": (ranks == 1).mean(), "recall@10": (ranks <= 10).mean(),
            "mrr@10": np.mean([1 / r if r <= 10 else 0 for r in ranks]),
            "ndcg@10": np.mean([1 / np.log2(r + 1) if r <= 10 else 0 for r in ranks])}
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(100 * want[key], abs=1e-9), key


PAIRS = [("who bakes bread in the village of ashford?", "the baker of ashford bakes bread every morning"),
         ("x", "a very long passage " * 10), ("what?", "")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert):
    """A finished run (RUN/model exported), trained once for the export, encode and eval tests."""
    folder = tmp_path_factory.mktemp("cross-encoder-run")
    argv = ["train", "text", *KIND, *TINY["text"], "--model", str(tiny_bert), "--negatives-per-query", "1",
            "--max-length", "12", "--test-size", "8", "--output-dir", str(folder)]
    assert main(argv) == 0
    return folder


def _predicted(folder):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import CrossEncoder

    loaded = CrossEncoder(str(folder), local_files_only=True)
    assert loaded.max_seq_length == 12
    return loaded.predict(PAIRS, batch_size=2)


@pytest.mark.slow
def test_the_export_predicts_the_runs_scores(trained):
    """sentence-transformers' CrossEncoder loads RUN/model offline; its predict is Sigmoid of the run's scores."""
    from gradcache.train.commands.model import load_run

    _, model, _ = load_run(trained)
    with torch.no_grad():
        want = torch.sigmoid(model(PAIRS)).numpy()
    np.testing.assert_allclose(_predicted(trained / "model"), want, rtol=1e-5, atol=1e-6)
    card = (trained / "model" / "README.md").read_text()
    assert "gradcache train text --kind cross-encoder" in card and "`--in-batch-negatives` | 4" in card
    assert main(["export", str(trained), "--output", str(trained / "model")]) == 0  # replaces its own export
    np.testing.assert_allclose(_predicted(trained / "model"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("source", ["run", "export"])
def test_encode_writes_one_predict_score_per_row(tmp_path, trained, source):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"q": q, "p": p}) + "\n" for q, p in PAIRS), encoding="utf-8")
    model = trained if source == "run" else trained / "model"
    out = tmp_path / "scores.npy"
    assert main(["encode", str(model), "--data", str(data), "--output", str(out), "--pair-keys", "q", "p",
                 "--batch-size", "2"]) == 0
    np.testing.assert_allclose(np.load(out), _predicted(trained / "model"), rtol=1e-5, atol=1e-6)


def test_encode_refuses_what_a_cross_encoder_cannot_write(tmp_path, trained, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"query": "q", "passage": "p"}) + "\n", encoding="utf-8")
    assert main(["encode", str(trained), "--data", str(data), "--output", str(tmp_path / "x.faiss")]) == 2
    assert main(["encode", str(trained), "--data", str(data), "--output", str(tmp_path / "x.npy"), "--key",
                 "query"]) == 2
    assert "--pair-keys" in capsys.readouterr().err and not list(tmp_path.glob("x.*"))


@pytest.mark.slow
def test_eval_of_the_run_and_of_its_export(tmp_path, trained, capsys):
    """`gradcache eval RUN` repeats the run's final metrics; RUN and RUN/model score a rows file alike."""
    assert main(["eval", str(trained)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    final = json.loads((trained / "metrics.json").read_text())
    assert {key: metrics[key] for key in METRICS} == {key: final[key] for key in METRICS}
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"query": f"who is resident {i}?", "positive": f"resident {i} bakes bread",
                                        "negative": f"resident {i + 1} sails"}) + "\n" for i in range(12)),
                    encoding="utf-8")
    scored = []
    for model in (trained, trained / "model"):
        assert main(["eval", str(model), "--data", str(data), "--negative-keys", "negative"]) == 0
        scored.append(json.loads(capsys.readouterr().out))
    assert scored[0]["queries"] == 12 and set(METRICS) <= scored[0].keys()
    for key in METRICS:
        assert scored[0][key] == pytest.approx(scored[1][key]), key


@pytest.mark.parametrize("options,named", [
    (["--separate-towers"], "--separate-towers"), (["--pooling", "cls"], "--pooling"),
    (["--matryoshka-dims", "8"], "--matryoshka-dims"), (["--queue-size", "8"], "--queue-size"),
    (["--in-batch-negatives", "0", "--negatives-per-query", "0"], "--in-batch-negatives"),
    (["--in-batch-negatives", "-1"], "--in-batch-negatives"), (["--data", "world", "--lora-rank", "2"], "--lora-rank"),
])
def test_options_it_cannot_honour_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys, options, named):
    out = tmp_path / "out"
    argv = ["train", "text", *KIND, *TINY["text"], "--model", str(tiny_bert), "--output-dir", str(out), *options]
    assert main(argv) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


def test_a_grouped_run_reads_its_config(tiny_bert):
    """The configuration a checkpoint stores round-trips the kind's option."""
    config = _config(tiny_bert, in_batch_negatives=7)
    assert RunConfig.from_dict(config.to_dict()).in_batch_negatives == 7
    assert dataclasses.replace(config, kind="dense").in_batch_negatives == 7


def test_streamed_data_exits_2_and_writes_nothing(tmp_path, tiny_bert, capsys):
    """A .jsonl.gz is streamed, its rows without the places the in-batch draw is seeded by: refused, named."""
    import gzip

    rows = "".join(json.dumps({"query": f"q {i}", "positive": f"p {i}"}) + "\n" for i in range(40))
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    out = tmp_path / "out"
    assert main(["train", "text", *KIND, *TINY["text"], "--model", str(tiny_bert), "--test-size", "8",
                 "--data", str(tmp_path / "rows.jsonl.gz"), "--output-dir", str(out)]) == 2
    assert "rows.jsonl.gz" in capsys.readouterr().err and not out.exists()


def _train_on_rank(rank, world_size, argv):
    return main(argv), torch.distributed.get_world_size()


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path, tiny_bert):
    """Two gloo ranks, each scoring its half of the groups, train the model one process trains on the whole batch
    (no in-batch draw: each rank would draw among its own rows; the groups are the rows' own)."""
    from tests.multiprocess import run_on_ranks

    argv = ["train", "text", *KIND, *TINY["text"], "--model", str(tiny_bert), "--negatives-per-query", "1",
            "--in-batch-negatives", "0", "--test-size", "8", "--workers", "0"]
    assert run_on_ranks(_train_on_rank, 2, [*argv, "--output-dir", str(tmp_path / "two")]) == [(0, 2)] * 2
    assert main([*argv, "--output-dir", str(tmp_path / "one")]) == 0
    two, one = (load_checkpoint(tmp_path / d) for d in ("two", "one"))
    for name in one["model"]:
        torch.testing.assert_close(two["model"][name], one["model"][name], rtol=1e-4, atol=1e-5, msg=name)
    losses = [[float(loss) for _, loss in _losses(tmp_path / d)] for d in ("two", "one")]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
def test_bf16_checkpointing_workers_and_naive_run(tmp_path, tiny_bert):
    """The run's other options reach the cross-encoder: autocast, activation checkpointing, a loader worker
    (which pickles the collate), naive accumulation over whole groups."""
    argv = ["train", "text", *KIND, *TINY["text"], "--model", str(tiny_bert), "--test-size", "8", "--max-length",
            "16", "--precision", "bf16", "--grad-checkpointing", "--workers", "1", "--strategy", "naive",
            "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    assert len(_losses(tmp_path)) == 2 and (tmp_path / "model" / "model.safetensors").is_file()


def test_the_dense_kind_refuses_the_cross_encoders_option(tmp_path, tiny_bert, capsys):
    out = tmp_path / "out"
    assert main(["train", "text", *TINY["text"], "--model", str(tiny_bert), "--in-batch-negatives", "2",
                 "--output-dir", str(out)]) == 2
    assert "--in-batch-negatives" in capsys.readouterr().err and not out.exists()
