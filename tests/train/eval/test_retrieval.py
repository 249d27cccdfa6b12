import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.eval.embed import embed_texts
from gradcache.train.eval.retrieval import (
    evaluate_retrieval,
    retrieval_corpus,
    retrieval_metrics,
)


def _brute_force(queries, corpus, relevant, depth=10):
    """From the definitions: rank every passage by cosine, find the relevant one, score the top `depth`."""
    scores = {"recall@1": 0.0, "recall@10": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0}
    for query, target in zip(queries, relevant):
        similarity = [float(np.dot(query, passage)) for passage in corpus]
        ranking = sorted(range(len(corpus)), key=lambda j: -similarity[j])[:depth]
        dcg = sum(1.0 / math.log2(position + 2) for position, j in enumerate(ranking) if j == target)
        ideal = 1.0  # one relevant passage, at rank 1
        rank = ranking.index(target) + 1 if target in ranking else None
        scores["recall@1"] += rank == 1
        scores["recall@10"] += rank is not None
        scores["mrr@10"] += 1.0 / rank if rank else 0.0
        scores["ndcg@10"] += dcg / ideal
    return {key: 100.0 * value / len(queries) for key, value in scores.items()}


@pytest.mark.parametrize("num_queries, corpus_size, dim", [(1, 1, 4), (7, 5, 3), (40, 60, 8), (50, 200, 16)])
def test_metrics_against_brute_force(num_queries, corpus_size, dim):
    generator = torch.Generator().manual_seed(num_queries * corpus_size)
    corpus = F.normalize(torch.randn(corpus_size, dim, generator=generator), dim=1)
    relevant = torch.randint(0, corpus_size, (num_queries,), generator=generator)
    # queries near their passage so that ranks spread over 1 .. beyond 10
    queries = F.normalize(corpus[relevant] + 0.8 * torch.randn(num_queries, dim, generator=generator), dim=1)
    measured = retrieval_metrics(queries.numpy(), corpus.numpy(), relevant.numpy())
    expected = _brute_force(queries.double().numpy(), corpus.double().numpy(), relevant.tolist())
    assert measured.keys() == expected.keys()
    for key in expected:
        assert measured[key] == pytest.approx(expected[key], abs=1e-9), key
    if corpus_size > 10:
        assert 0 < measured["recall@10"] < 100, "the case should have misses beyond rank 10"


def test_bad_relevant_indices():
    with pytest.raises(ValueError, match="relevant must hold one corpus index"):
        retrieval_metrics(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.array([0, 4]))


def test_corpus_holds_each_distinct_passage_once():
    pairs = TextPairs(["q1", "q2", "q3"], ["a", "b", "a"], [["b", "c"], ["d", "c"], ["e", "d"]])
    corpus, relevant = retrieval_corpus(pairs)
    assert corpus == ["a", "b", "c", "d", "e"]
    assert relevant.tolist() == [0, 1, 0]


def test_embed_texts_keeps_the_callers_order():
    texts = ["ccc", "a", "bbbbbb", "dd", "e"]

    def tokenize(batch):
        return {"input_ids": torch.tensor([[len(text), ord(text[0])] for text in batch], dtype=torch.float32)}

    embeddings = embed_texts(lambda input_ids: input_ids, tokenize, texts, torch.device("cpu"), batch_size=2)
    expected = F.normalize(torch.tensor([[len(t), ord(t[0])] for t in texts], dtype=torch.float32), dim=1)
    torch.testing.assert_close(torch.as_tensor(embeddings), expected)


def test_evaluate_retrieval_uses_each_tower_for_its_texts():
    # one-hot "embeddings" by first letter: queries embed as their passage's letter through the query tower
    pairs = TextPairs(["x->a", "x->b"], ["a", "b"], [["b"], ["c"]])
    letters = "abcx"

    def tokenize(batch):
        return {"input_ids": torch.tensor([[letters.index(text[-1])] for text in batch])}

    def one_hot(input_ids):
        return F.one_hot(input_ids[:, 0], len(letters)).float()

    perfect = evaluate_retrieval(one_hot, one_hot, tokenize, pairs, torch.device("cpu"))
    assert perfect == {"recall@1": 100.0, "recall@10": 100.0, "mrr@10": 100.0, "ndcg@10": 100.0}
    shifted = evaluate_retrieval(lambda input_ids: one_hot((input_ids + 1) % 3), one_hot, tokenize, pairs,
                                 torch.device("cpu"))
    assert shifted["recall@1"] == 0.0
