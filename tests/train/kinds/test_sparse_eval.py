"""`--kind sparse` evaluation and export: the sparse retrieval metrics against a brute-force ranking written here
(ties included), the run's own metrics against its model's rows scored here, and RUN/model loaded by
sentence-transformers' SparseEncoder, offline, encoding as the run's model does."""
import json
import math

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.models import HuggingFaceTokenizer
from gradcache.train.commands.model import load_run
from gradcache.train.config import RunConfig
from gradcache.train.eval.sparse_retrieval import sparse_metrics
from gradcache.train.outputs.sparse_rows import CsrRows
from gradcache.train.modes import mode_of
from tests.train.conftest import TINY

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')


def brute_force(queries: np.ndarray, corpus: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    """Each query's corpus sorted by (score descending, corpus index), the metrics read off the positive's place."""
    recall1 = recall10 = mrr = ndcg = 0.0
    for query, target in zip(queries, relevant):
        scores = [float(np.dot(query.astype(np.float64), passage.astype(np.float64))) for passage in corpus]
        ranking = sorted(range(len(corpus)), key=lambda c: (-scores[c], c))
        rank = ranking.index(target) + 1
        recall1 += rank == 1
        recall10 += rank <= 10
        mrr += 1 / rank if rank <= 10 else 0
        ndcg += 1 / math.log2(rank + 1) if rank <= 10 else 0
    n = len(queries)
    return {"recall@1": 100 * recall1 / n, "recall@10": 100 * recall10 / n, "mrr@10": 100 * mrr / n,
            "ndcg@10": 100 * ndcg / n, "nonzeros_per_query": float((queries != 0).sum(1).mean()),
            "nonzeros_per_document": float((corpus != 0).sum(1).mean())}


brute_force.KEYS = ("recall@1", "recall@10", "mrr@10", "ndcg@10", "nonzeros_per_query", "nonzeros_per_document")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_metrics_equal_a_brute_force_ranking_with_ties(seed):
    generator = np.random.default_rng(seed)
    corpus = generator.integers(0, 3, (40, 12)) * (generator.random((40, 12)) < 0.3)  # small integers: many ties
    corpus[5] = 0  # an empty row
    queries = generator.integers(0, 3, (17, 12)) * (generator.random((17, 12)) < 0.5)
    relevant = generator.integers(0, 40, 17)
    got = sparse_metrics(CsrRows.from_dense(torch.tensor(queries, dtype=torch.float32)),
                         CsrRows.from_dense(torch.tensor(corpus, dtype=torch.float32)), relevant)
    assert got == pytest.approx(brute_force(queries, corpus, relevant), rel=1e-12)


def test_csr_rows_round_trip_through_their_npz_file(tmp_path):
    rows = torch.relu(torch.randn(6, 9))
    rows[3] = 0
    saved = CsrRows.from_dense(rows)
    saved.save(tmp_path / "rows.npz")
    with np.load(tmp_path / "rows.npz") as arrays:
        assert sorted(arrays.files) == ["data", "indices", "indptr", "shape"]
        assert arrays["indptr"].dtype == np.int64 and arrays["data"].dtype == np.float32
    loaded = CsrRows.load(tmp_path / "rows.npz")
    np.testing.assert_array_equal(loaded.to_dense(), rows.numpy())
    assert loaded.shape == (6, 9)


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory, tiny_bert):
    """A 2-step run from the tiny BERT *without* an MLM head (initialised by transformers), with both prompts."""
    folder = tmp_path_factory.mktemp("sparse_run")
    assert main(["train", "text", "--kind", "sparse", "--model", str(tiny_bert), *TINY["text"], "--output-dir",
                 str(folder), "--negatives-per-query", "1", "--query-prompt", "query: ", "--passage-prompt",
                 "passage: "]) == 0
    return folder


def test_a_folder_without_an_mlm_head_gets_one_quietly(tiny_bert, capfd):
    config = RunConfig(mode="text", kind="sparse", model=str(tiny_bert))
    model = mode_of(config).build_model(config)
    printed = capfd.readouterr()
    for alarming in ("LOAD REPORT", "MISSING", "newly initialized", "Warning", "Loading weights"):
        assert alarming not in printed.err + printed.out
    assert model.query_tower.out_dim == model.query_tower.model.config.vocab_size
    assert any(name.startswith("cls.predictions.transform") for name, _ in model.query_tower.model.named_parameters())


def held_out(folder):
    """The run's model, tokenizer, held-out rows, their corpus and each query's positive in it."""
    config, model, _ = load_run(folder)
    splits = mode_of(config).load_data(config)
    tokenizer = HuggingFaceTokenizer(config.model, config.max_length)
    corpus = list(dict.fromkeys(p for row in zip(splits.test.positives, *zip(*splits.test.negatives)) for p in row))
    return model, tokenizer, splits.test, corpus, np.array([corpus.index(p) for p in splits.test.positives])


def alone(tokenizer, texts, prompt, encode):
    """Rows of `texts`, each encoded alone (no padding)."""
    with torch.no_grad():
        return torch.cat([encode(**tokenizer([text], prompt=prompt)) for text in texts]).numpy()


@pytest.mark.slow
def test_the_runs_metrics_equal_its_rows_ranked_here_and_the_export_loads_in_sparse_encoder(sparse_run,
                                                                                         monkeypatch):
    metrics = json.loads((sparse_run / "metrics.json").read_text())
    card = (sparse_run / "model" / "README.md").read_text()
    assert "gradcache train text --kind sparse" in card and "| `--query-regularizer-weight` | 5e-05 |" in card
    model, tokenizer, test, corpus, relevant = held_out(sparse_run)
    queries = alone(tokenizer, test.queries, "query: ", model.encode_query)
    passages = alone(tokenizer, corpus, "passage: ", model.encode_passage)
    want = brute_force(queries, passages, relevant)
    assert {key: metrics[key] for key in want} == pytest.approx(want, rel=1e-6)
    assert 0 < want["nonzeros_per_query"] < queries.shape[1]

    from sentence_transformers import SparseEncoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exported = SparseEncoder(str(sparse_run / "model"), device="cpu", local_files_only=True)
    assert exported.similarity_fn_name == "dot" and exported.max_seq_length == 24
    texts = [*test.queries[:3], "a text much longer than the run's twenty-four tokens " * 4]
    theirs = exported.encode_query(texts, convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(theirs, alone(tokenizer, texts, "query: ", model.encode_query), rtol=1e-5, atol=1e-6)
    theirs = exported.encode_document(corpus[:3], convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(theirs, passages[:3], rtol=1e-5, atol=1e-6)


def test_its_export_is_a_model_to_train_from(sparse_run):
    """`--kind sparse --model RUN/model`: the SparseEncoder folder passes the checks and builds the trained model."""
    config = RunConfig(mode="text", kind="sparse", model=str(sparse_run / "model"), max_length=24)
    mode = mode_of(config)
    mode.check_model(config)
    assert mode.embedding_width(config) == 141
    built = mode.build_model(config).eval()
    trained, tokenizer, test, _, _ = held_out(sparse_run)
    texts = test.queries[:4]
    np.testing.assert_allclose(alone(tokenizer, texts, None, built.encode_query),
                               alone(tokenizer, texts, None, trained.encode_query), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("source", ["run", "model"])
@pytest.mark.parametrize("tower", ["query", "passage"])
def test_encode_writes_the_rows_sparse_encoder_gives(sparse_run, tmp_path, source, tower):
    from sentence_transformers import SparseEncoder

    texts = ["who bakes bread?", "the red mill stands by the river " * 6, "ada"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    model = sparse_run if source == "run" else sparse_run / "model"
    argv = ["encode", str(model), "--data", str(tmp_path / "texts.txt"), "--tower", tower]
    assert main([*argv, "--output", str(tmp_path / "rows.npz")]) == 0
    rows = CsrRows.load(tmp_path / "rows.npz")
    exported = SparseEncoder(str(sparse_run / "model"), device="cpu", local_files_only=True)
    encode = exported.encode_query if tower == "query" else exported.encode_document
    want = encode(texts, convert_to_sparse_tensor=False).numpy()
    assert rows.shape == want.shape and rows.nonzeros_per_row().tolist() == (want != 0).sum(1).tolist()
    np.testing.assert_allclose(rows.to_dense(), want, rtol=1e-5, atol=1e-6)
    assert main([*argv, "--output", str(tmp_path / "rows.npy")]) == 2  # dense formats hold no sparse rows
    assert not (tmp_path / "rows.npy").exists()


def test_a_dense_model_refuses_npz(tiny_bert, tmp_path, capsys):
    (tmp_path / "texts.txt").write_text("a\nb\n", encoding="utf-8")
    assert main(["encode", str(tiny_bert), "--data", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "rows.npz")]) == 2
    assert "SPLADE" in capsys.readouterr().err and not (tmp_path / "rows.npz").exists()


def test_eval_scores_the_run_and_its_export_by_sparse_retrieval(sparse_run, tmp_path, capsys):
    metrics = json.loads((sparse_run / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(sparse_run)]) == 0  # its own held-out split, as the run scored it
    again = json.loads(capsys.readouterr().out)
    assert {key: again[key] for key in brute_force.KEYS} == pytest.approx(
        {key: metrics[key] for key in brute_force.KEYS}, rel=1e-9)

    model, tokenizer, test, corpus, relevant = held_out(sparse_run)
    rows = [{"query": q, "positive": p, "negative": n[0]} for q, p, n in zip(test.queries, test.positives,
                                                                              test.negatives)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    want = brute_force(alone(tokenizer, test.queries, "query: ", model.encode_query),
                       alone(tokenizer, corpus, "passage: ", model.encode_passage), relevant)
    for source in (sparse_run, sparse_run / "model"):  # the run, and the folder (its saved prompts)
        assert main(["eval", str(source), "--data", str(tmp_path / "pairs.jsonl"), "--negative-keys",
                     "negative"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert {key: got[key] for key in want} == pytest.approx(want, rel=1e-6)
        assert got["queries"] == len(test) and got["corpus_size"] == len(corpus)


def test_mine_refuses_a_sparse_model(sparse_run, tmp_path, capsys):
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"query": "a", "positive": "b"}) + "\n", encoding="utf-8")
    assert main(["mine", str(sparse_run / "model"), "--data", str(tmp_path / "pairs.jsonl"), "--output",
                 str(tmp_path / "mined.jsonl"), "--negatives", "1"]) == 2
    assert "sparse text model" in capsys.readouterr().err
