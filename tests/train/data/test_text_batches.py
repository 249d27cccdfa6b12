import pytest
import torch

from gradcache import FullBatch, GradCache, NaiveAccumulation
from gradcache.losses import InfoNCE
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.batches import TokenizeGroups, split_groups, text_batches
from gradcache.train.modes.grouped_infonce import GroupedInfoNCE
from gradcache.train.data.text.text_pairs import TextPairs


def _pairs(count=12, hard=2):
    return TextPairs([f"q{i}" for i in range(count)], [f"p{i}" for i in range(count)],
                     [[f"n{i}_{j}" for j in range(hard)] for i in range(count)])


def test_batches_follow_the_sampler_and_group_passages_by_query():
    pairs = _pairs()
    sampler = StepSampler(len(pairs), 4, seed=0, start_step=0, total_steps=3)
    seen = []
    loader = text_batches(pairs, sampler, lambda texts: {"texts": texts}, workers=0)
    for (queries, passages), step_items in zip(loader, sampler):
        indices = [index for _, index in step_items]
        assert queries["texts"] == [f"q{i}" for i in indices]
        assert passages["texts"] == [text for i in indices for text in (f"p{i}", f"n{i}_0", f"n{i}_1")]
        seen.append(indices)
    assert len(seen) == 3


def test_split_groups_and_the_loss_against_infonce():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    positive = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    negatives = torch.randn(10, 8, generator=generator, dtype=torch.float64)  # 2 per query, grouped by query
    passages = torch.stack([positive, negatives[0::2], negatives[1::2]], dim=1).reshape(15, 8)
    got_positive, got_negatives = split_groups(passages, 2)
    assert torch.equal(got_positive, positive) and torch.equal(got_negatives, negatives)
    for symmetric in (False, True):
        expected = InfoNCE(temperature=0.1, symmetric=symmetric)(query, positive, negatives)
        loss = GroupedInfoNCE(2, temperature=0.1, symmetric=symmetric)(query, passages)
        torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert split_groups(positive, 0)[1] is None
    torch.testing.assert_close(GroupedInfoNCE(0, 0.1)(query, positive), InfoNCE(0.1)(query, positive))
    with pytest.raises(ValueError, match="3 rows per query"):
        GroupedInfoNCE(2, 0.1)(query, positive)


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
@pytest.mark.parametrize("hard", [0, 2])
def test_gradcache_gradient_equals_the_full_batch_on_every_parameter(tmp_path, separate, hard):
    pytest.importorskip("transformers")
    from gradcache.models.bi_encoder import BiEncoder
    from gradcache.models.hf_tokenizer import HuggingFaceTokenizer
    from gradcache.models.huggingface import HuggingFaceEncoder

    from tests.tiny_text_model import write_tiny_bert

    path = write_tiny_bert(tmp_path / "bert")  # no dropout: chunks and the full batch would draw other masks
    tokenize = HuggingFaceTokenizer(path, max_length=20)
    pairs = _pairs(count=6, hard=hard)
    queries, passages = TokenizeGroups(tokenize)([(q, [p, *n]) for q, p, n in zip(pairs.queries, pairs.positives,
                                                                                 pairs.negatives)])
    loss_fn = GroupedInfoNCE(hard, temperature=0.05)
    gradients = {}
    for name, strategy in [("full", FullBatch), ("gradcache", GradCache), ("naive", NaiveAccumulation)]:
        torch.manual_seed(0)
        model = BiEncoder(*[HuggingFaceEncoder(path) for _ in range(1 + separate)])
        encoders = [model.query_tower, model.passage_tower] if separate else model.query_tower
        chunks = {} if strategy is FullBatch else {"chunk_size": (4, 4 * (1 + hard))}  # an uneven last chunk
        torch.manual_seed(1)
        strategy(encoders, loss_fn, **chunks, trim_padding=True).step(queries, passages)
        gradients[name] = {key: p.grad.clone() for key, p in model.named_parameters()}
        assert all(p.grad is not None for p in model.parameters())
    # relative to the largest gradient entry: some entries are 0 in exact arithmetic (BERT's key bias: softmax
    # ignores a shift shared by every score), and their float noise has no scale of its own
    scale = max(full.abs().max() for full in gradients["full"].values())
    for key, full in gradients["full"].items():
        torch.testing.assert_close(gradients["gradcache"][key] / scale, full / scale, rtol=0, atol=1e-5, msg=key)
    differs = any(not torch.allclose(gradients["naive"][k], g, atol=1e-6) for k, g in gradients["full"].items())
    assert differs, "naive accumulation sees only its micro-batch's negatives and should differ"


def _queries_drawn(rank, world_size, data, workers, steps):
    """The queries of each step of this rank, drawn through the loader with `workers` worker processes."""
    from gradcache.train.data.text.files import data_files
    from gradcache.train.data.text.indexed_pairs import IndexedPairs
    from gradcache.train.data.text.row_index import build_row_index

    rows = IndexedPairs(build_row_index(*data_files(data), negative_keys=["negative"]))
    sampler = StepSampler(len(rows), 8, seed=3, start_step=0, total_steps=steps, rank=rank, world_size=world_size)
    return [queries for queries, _ in text_batches(rows, sampler, list, workers)]


def test_two_ranks_of_two_workers_see_every_row_once_an_epoch_in_the_one_process_order(tmp_path):
    """2 gloo ranks (spawned on loopback), each reading a JSONL through 2 loader workers: within an epoch no row
    repeats and every row is drawn but the partial batch's; the global batches are those of one process
    without workers, so the order depends on neither the ranks nor the workers."""
    import json

    from tests.multiprocess import run_on_ranks

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"query": f"q{i}", "positive": f"p{i}", "negative": f"n{i}"}) + "\n"
                            for i in range(37)))  # 4 steps of 8 an epoch, 5 rows left over
    ranks = run_on_ranks(_queries_drawn, 2, str(data), 2, 8)
    alone = _queries_drawn(0, 1, str(data), 0, 8)
    global_batches = [first + second for first, second in zip(*ranks)]
    assert global_batches == alone
    for epoch in range(2):
        drawn = [query for batch in global_batches[4 * epoch:4 * epoch + 4] for query in batch]
        assert len(drawn) == len(set(drawn)) == 32 and set(drawn) <= {f"q{i}" for i in range(37)}
    assert global_batches[:4] != global_batches[4:]  # each epoch its own permutation
