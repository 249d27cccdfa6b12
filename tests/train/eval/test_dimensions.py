"""The metrics of a Matryoshka run at each width: the first d columns of the embeddings, re-normalised."""
import numpy as np
import torch
import torch.nn.functional as F

from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.dimensions import at_dim, evaluation_dims, truncated
from gradcache.train.eval.retrieval import evaluate_retrieval


def test_truncated_rows_are_the_raw_prefixes_normalised():
    raw = torch.randn(6, 10, dtype=torch.float64)
    unit = F.normalize(raw, dim=1).numpy()
    for dim in (10, 7, 1):
        want = F.normalize(raw[:, :dim], dim=1).numpy()  # truncate the raw rows, then normalise
        np.testing.assert_allclose(truncated(unit, dim), want, rtol=1e-6)
    assert truncated(np.zeros((2, 4), dtype=np.float32), 2).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_the_full_width_keeps_its_names():
    assert evaluation_dims([16, 8, 4], 16) == [8, 4]
    assert evaluation_dims([12, 8], 16) == [12, 8]  # a largest dim below the width is scored too
    assert evaluation_dims(None, 16) == []
    assert at_dim({"mrr@10": 1.0}, 8) == {"mrr@10@8": 1.0}


def test_retrieval_at_a_width_equals_retrieval_by_encoders_of_that_width():
    generator = torch.Generator().manual_seed(0)
    queries, passages = [f"q{i}" for i in range(30)], [f"p{i}" for i in range(30)]
    pairs = TextPairs(queries, passages, [[f"p{(i + 1) % 30}"] for i in range(30)])
    table = torch.randn(60, 12, generator=generator)  # text i's raw embedding: row i (queries), 30 + i (passages)
    table[30:] = table[:30] + 0.9 * torch.randn(30, 12, generator=generator)  # near their queries: ranks spread

    def tokenize(batch):
        return {"input_ids": torch.tensor([[int(t[1:]) + 30 * (t[0] == "p")] for t in batch])}

    def encode(width):
        return lambda input_ids: table[input_ids[:, 0], :width]

    cpu = torch.device("cpu")
    measured = evaluate_retrieval(encode(12), encode(12), tokenize, pairs, cpu, dims=[12, 6, 3])
    assert set(measured) == {f"{m}{suffix}" for m in ("recall@1", "recall@10", "mrr@10", "ndcg@10")
                             for suffix in ("", "@6", "@3")}
    for width in (6, 3):
        narrow = evaluate_retrieval(encode(width), encode(width), tokenize, pairs, cpu)
        for key, value in narrow.items():
            assert measured[f"{key}@{width}"] == value, (key, width)
    assert measured["mrr@10@3"] != measured["mrr@10"]  # the widths do differ here: the test can fail
