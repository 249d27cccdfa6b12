"""The text kinds' losses over their grouped batches, each against a loop written from its docstring's formula:
`GroupedInfoNCE` (the dense kind's: each query's passages grouped after it, positive first) and `GroupedRerank`
(the cross-encoder's: each query's G pair scores, positive first)."""
import math

import pytest
import torch

from gradcache.train.modes.grouped_infonce import GroupedInfoNCE
from gradcache.train.modes.grouped_rerank import GroupedRerank


def _unit(rows: torch.Tensor) -> list[list[float]]:
    return [[value / math.sqrt(sum(v * v for v in row)) for value in row] for row in rows.tolist()]


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


@pytest.mark.parametrize("queries, hard", [(1, 0), (1, 2), (4, 0), (5, 3)])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_grouped_infonce_against_the_formula(queries, hard, temperature):
    generator = torch.Generator().manual_seed(queries * 10 + hard)
    query = torch.randn(queries, 6, generator=generator, dtype=torch.float64)
    passages = torch.randn(queries * (1 + hard), 6, generator=generator, dtype=torch.float64)
    q, p = _unit(query), _unit(passages)
    total = 0.0
    for i in range(queries):  # every passage of the batch is a candidate of every query; its own positive the target
        logits = [_dot(q[i], candidate) / temperature for candidate in p]
        total -= logits[i * (1 + hard)] - math.log(sum(math.exp(logit) for logit in logits))
    loss = GroupedInfoNCE(hard, temperature)(query, passages)
    torch.testing.assert_close(loss, torch.tensor(total / queries, dtype=torch.float64), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("queries, group", [(1, 2), (3, 2), (4, 5)])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_grouped_rerank_against_the_formula(queries, group, temperature):
    scores = torch.randn(queries * group, generator=torch.Generator().manual_seed(queries + group),
                         dtype=torch.float64) * 3
    total = 0.0
    for i in range(queries):  # sigmoid of each score of query i's group, over t; its positive (first) the target
        logits = [1 / (1 + math.exp(-s)) / temperature for s in scores[i * group:(i + 1) * group].tolist()]
        total -= logits[0] - math.log(sum(math.exp(logit) for logit in logits))
    loss_fn = GroupedRerank(group, temperature)
    torch.testing.assert_close(loss_fn(scores), torch.tensor(total / queries, dtype=torch.float64),
                               rtol=1e-10, atol=1e-12)
    assert loss_fn.negatives_per_anchor(seen=queries * group) == group - 1
    assert loss_fn.temperature == temperature
