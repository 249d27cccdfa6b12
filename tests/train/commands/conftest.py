"""A small pairs file, a tiny text run, and a reference embedder for the commands' tests.

The reference embeds one text at a time, with transformers' own AutoModel and AutoTokenizer (no padding, no
batching, no code of the program), mean-pools by the formula and L2-normalises in NumPy; the tests rank with
plain loops over its cosine scores."""
import csv

import numpy as np
import pytest
import torch

from gradcache.cli import main
from tests.train.conftest import text_args

transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

PEOPLE = ["ann", "bob", "cyd", "dee", "eve", "fay", "gus", "hal", "ida", "jon", "kim", "lou"]
JOBS = ["bakes bread", "fixes teeth", "flies planes", "keeps bees"]


def pair_rows():
    """12 rows: each query's positive, and a hard negative that is another row's positive (so the corpus of
    distinct passages is smaller than positives + negatives)."""
    rows = []
    for i, name in enumerate(PEOPLE):
        rows.append({"query": f"who {JOBS[i % 4]} in town {i % 3}?",
                     "positive": f"{name} {JOBS[i % 4]} in town {i % 3}.",
                     "hard": f"{PEOPLE[(i + 1) % 12]} {JOBS[(i + 1) % 4]} in town {(i + 1) % 3}."})
    return rows


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.tsv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["query", "positive", "hard"], delimiter="\t")
        writer.writeheader()
        writer.writerows(pair_rows())
    return path


@pytest.fixture(scope="module")
def text_run(tiny_bert, tmp_path_factory):
    """A 2-step `gradcache train text` run on the tiny BERT (max length 24)."""
    folder = tmp_path_factory.mktemp("run") / "text"
    assert main(text_args(tiny_bert, folder)) == 0
    return folder


class Reference:
    """texts -> (N, D) L2-normalised float64 mean-pooled embeddings, one text at a time."""

    def __init__(self, folder, state=None, max_length=128):
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        if state is not None:  # a run's checkpoint: the shared tower's weights (its pooler was dropped)
            prefix = "towers.0.model."
            weights = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            assert not unexpected and all(name.startswith("pooler.") for name in missing)
        self.max_length = max_length

    @torch.no_grad()
    def __call__(self, texts):
        rows = []
        for text in texts:
            tokens = self.tokenizer(text, truncation=True, max_length=self.max_length, return_tensors="pt")
            hidden = self.model(**tokens).last_hidden_state[0].double().numpy()  # (L, H), every token real
            pooled = hidden.mean(axis=0)
            rows.append(pooled / np.linalg.norm(pooled))
        return np.stack(rows)


def brute_force_metrics(queries, corpus, relevant):
    """recall@1, recall@10, mrr@10, ndcg@10 in percent, by a loop over queries and a count of better passages."""
    totals = dict.fromkeys(("recall@1", "recall@10", "mrr@10", "ndcg@10"), 0.0)
    for query, target in zip(queries, relevant):
        scores = [float(query @ passage) for passage in corpus]
        rank = 1 + sum(score > scores[target] for score in scores)
        totals["recall@1"] += rank == 1
        totals["recall@10"] += rank <= 10
        totals["mrr@10"] += 1 / rank if rank <= 10 else 0
        totals["ndcg@10"] += 1 / np.log2(rank + 1) if rank <= 10 else 0
    return {key: 100 * value / len(queries) for key, value in totals.items()}


def distinct_passages(rows, negative_key="hard"):
    """The corpus a pairs file makes: every distinct positive and hard negative, in order of first appearance."""
    passages = []
    for row in rows:
        for passage in (row["positive"], *([row[negative_key]] if negative_key else [])):
            if passage not in passages:
                passages.append(passage)
    return passages
