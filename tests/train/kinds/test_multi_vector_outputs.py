"""What a `--kind multi-vector` run gives: its MaxSim retrieval metrics against ranks computed here by loops over
each text encoded alone; `RUN/model` loaded by sentence-transformers' MultiVectorEncoder encodes as the run's model;
`gradcache encode` of the run and of its export writes those token vectors (.npz); `gradcache eval` reproduces the
run's metrics."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.train.commands.model import load_run
from gradcache.train.eval import maxsim
from gradcache.train.modes import mode_of
from gradcache.train.modes.text_folders import side_tokenizers
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")
PROMPTS = ["--query-prompt", "query: ", "--passage-prompt", "passage: "]
TEXTS = ["who bakes bread?", "a much longer passage about the baker, of the village, and the mill.", "x"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert):
    folder = tmp_path_factory.mktemp("multi-vector") / "run"
    argv = text_args(tiny_bert, folder, "--kind", "multi-vector", "--token-dim", "8", "--temperature", "1",
                     "--negatives-per-query", "1", *PROMPTS)
    assert main(argv) == 0
    return folder


def _token_loops(q, d):
    """sum_i max_j <q_i, d_j> by loops over the tokens."""
    return sum(max(float(q[i] @ d[j]) for j in range(len(d))) for i in range(len(q)))


def _pairwise(q, d):
    """sum_i max_j <q_i, d_j> of one pair, as a (n_q, n_d) product."""
    return float((q @ d.T).max(dim=1).values.sum())


def _brute_force_metrics(query_vectors, passage_vectors, relevant, score=_token_loops):
    """Each query's MaxSim against every passage, one pair at a time (float64), its positive's rank
    r = 1 + those above."""
    totals = dict.fromkeys(METRICS, 0.0)
    for q, own in zip(query_vectors, relevant):
        scores = [score(q, d) for d in passage_vectors]
        rank = 1 + sum(s > scores[own] for s in scores)
        totals["recall@1"] += rank == 1
        totals["recall@10"] += rank <= 10
        totals["mrr@10"] += 1 / rank if rank <= 10 else 0
        totals["ndcg@10"] += 1 / math.log2(rank + 1) if rank <= 10 else 0
    return {key: 100 * value / len(relevant) for key, value in totals.items()}


def test_maxsim_ranking_equals_loops_over_tokens(monkeypatch):
    monkeypatch.setattr(maxsim, "SCORE_BLOCK", 50)  # several blocks of queries
    generator = torch.Generator().manual_seed(0)

    def texts(count):
        return [torch.nn.functional.normalize(torch.randn(int(torch.randint(1, 6, (1,), generator=generator)), 4,
                                                          generator=generator, dtype=torch.float64), dim=-1)
                for _ in range(count)]

    queries, passages = texts(15), texts(23)
    relevant = np.array(torch.randint(0, 23, (15,), generator=generator).tolist())
    got = maxsim.ranked_metrics(maxsim.maxsim_scores(queries, passages), relevant)
    want = _brute_force_metrics(queries, passages, relevant)
    assert got == pytest.approx(want, abs=1e-9)
    assert 0 < got["recall@10"] < 100  # neither trivial nor empty


@pytest.mark.slow
def test_the_runs_metrics_are_maxsim_ranks_of_each_text_alone(run):
    config, model, _ = load_run(run)
    data = mode_of(config).load_data(config)
    corpus, relevant = maxsim.retrieval_corpus(data.test)
    query_tokens, passage_tokens = side_tokenizers(config)

    def alone(tokenizer, text):
        embedded = model.encode_query(**tokenizer([text]))
        return embedded.values[0][embedded.mask[0]].double()

    with torch.inference_mode():
        queries = [alone(query_tokens, q) for q in data.test.queries]
        passages = [alone(passage_tokens, p) for p in corpus]
    want = _brute_force_metrics(queries, passages, relevant, _pairwise)
    metrics = json.loads((run / "metrics.json").read_text())
    assert {key: metrics[key] for key in METRICS} == pytest.approx(want, abs=1e-9)


def _run_tokens(run, texts, side):
    """The run's own model: each text's scored token vectors (its side's prompt prepended)."""
    config, model, _ = load_run(run)
    tokenizer = side_tokenizers(config)[side == "passage"]
    with torch.inference_mode():
        return maxsim.embed_token_texts(model.encode_query, tokenizer, texts, torch.device("cpu"))


def test_the_export_loads_in_multi_vector_encoder_and_encodes_as_the_run(run):
    from sentence_transformers import MultiVectorEncoder

    peer = MultiVectorEncoder(str(run / "model"), device="cpu", local_files_only=True)
    assert peer.prompts["query"] == "query: " and peer.prompts["document"] == "passage: "
    assert peer.similarity_fn_name == "maxsim"
    for side, encode in (("query", peer.encode_query), ("passage", peer.encode_document)):
        ours = _run_tokens(run, TEXTS, side)
        theirs = encode(TEXTS)
        for mine, peer_tokens in zip(ours, theirs):
            assert mine.shape == peer_tokens.shape and mine.shape[1] == 8
            torch.testing.assert_close(mine, peer_tokens, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("source", ["run", "export"])
def test_encode_writes_the_token_vectors_as_values_and_offsets(run, tmp_path, source):
    from sentence_transformers import MultiVectorEncoder

    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model = str(run if source == "run" else run / "model")
    peer = MultiVectorEncoder(str(run / "model"), device="cpu", local_files_only=True)
    for tower, encode in (("query", peer.encode_query), ("passage", peer.encode_document)):
        output = tmp_path / f"{tower}.npz"
        assert main(["encode", model, "--data", str(data), "--output", str(output), "--tower", tower]) == 0
        written = np.load(output)
        assert written["values"].dtype == np.float32 and written["offsets"].dtype == np.int64
        offsets = written["offsets"]
        assert len(offsets) == len(TEXTS) + 1 and offsets[0] == 0 and offsets[-1] == len(written["values"])
        for i, want in enumerate(encode(TEXTS)):
            np.testing.assert_allclose(written["values"][offsets[i]:offsets[i + 1]], want.numpy(), rtol=1e-5,
                                       atol=1e-6)


def test_encode_refuses_a_dense_file_format(run, tmp_path, capsys):
    data = tmp_path / "texts.txt"
    data.write_text("a\n", encoding="utf-8")
    assert main(["encode", str(run / "model"), "--data", str(data), "--output", str(tmp_path / "x.npy")]) == 2
    assert "give a file ending in .npz" in capsys.readouterr().err
    assert not (tmp_path / "x.npy").exists()


def test_eval_reproduces_the_runs_metrics_and_scores_the_export_by_maxsim(run, tmp_path, capsys):
    assert main(["eval", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    evaluated = json.loads(capsys.readouterr().out)
    assert {key: evaluated[key] for key in METRICS} == {key: metrics[key] for key in METRICS}
    # the export on a pairs file: every row's query against the file's distinct passages, by MaxSim
    config, _, _ = load_run(run)
    test = mode_of(config).load_data(config).test
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "positive": p, "negative": n[0]}) + "\n"
                             for q, p, n in zip(test.queries, test.positives, test.negatives)), encoding="utf-8")
    assert main(["eval", str(run / "model"), "--data", str(pairs), "--negative-keys", "negative"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert {key: exported[key] for key in METRICS} == pytest.approx({key: metrics[key] for key in METRICS},
                                                                      abs=1e-9)
