"""GradCacheMultiVectorLoss against sentence-transformers' uncached MultiVectorMultipleNegativesRankingLoss on a
tiny random MultiVectorEncoder (one-layer BERT 32 wide, ColBERT query expansion), float64: loss and gradient of
every parameter, dropout on and off, hard negatives, several chunks, both spellings; one step inside
MultiVectorEncoderTrainer against the same step with the peer's loss; bad options."""
from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from sentence_transformers import MultiVectorEncoder  # noqa: E402
from sentence_transformers.base.losses.gradcache import _create_minibatch, _minibatch_ranges  # noqa: E402
from sentence_transformers.base.losses.merged_forward import column_merging_disabled  # noqa: E402
from sentence_transformers.multi_vector_encoder.losses import (  # noqa: E402
    CachedMultiVectorMultipleNegativesRankingLoss, MultiVectorMatryoshkaLoss, MultiVectorMultipleNegativesRankingLoss,
)
from sentence_transformers.util import cat_padded_token_embeddings  # noqa: E402

from gradcache.integrations.sentence_transformers import GradCacheMultiVectorLoss  # noqa: E402
from tests.integrations.sentence_models import COLUMNS, assert_close, save_tiny_bert  # noqa: E402

EXPANSION = {"strategy": "fixed", "attend": False, "length": 12}  # ColBERT's: scored, not attended


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-colbert") / "bert", dropout=0.1)


def tiny_colbert(folder, similarity: str = "maxsim", dtype=torch.float64) -> nn.Module:
    """Transformer, Dense(32 -> 128), MultiVectorMask, Normalize: the same weights every call."""
    torch.manual_seed(0)  # the Dense projection is initialised at random
    model = MultiVectorEncoder(str(folder), device="cpu", similarity_fn_name=similarity)
    model[0].query_expansion = dict(EXPANSION)
    return model.to(dtype)


def features(model, columns=("anchor", "positive", "negative"), rows: int = 7) -> list[dict]:
    """The trainer's `sentence_features`: each column tokenized for its task, the task stamped as the collator does."""
    out = []
    for i, column in enumerate(columns):
        task = "query" if i == 0 else "document"
        out.append({**model.preprocess(COLUMNS[column][:rows], task=task), "task": task})
    return out


class Chunked(nn.Module):
    """The model run chunk by chunk (`chunk` rows, each trimmed as the peer trims a mini-batch) in ONE graph, so
    an uncached loss over it draws the dropout masks GradCache draws and back-propagates through every chunk."""

    def __init__(self, model: nn.Module, chunk: int) -> None:
        super().__init__()
        self.model, self.chunk = model, chunk
        self.similarity = model.similarity

    def forward(self, features, task=None):
        outputs = [self.model(_create_minibatch(features, begin, end), task=task)
                   for begin, end in _minibatch_ranges(features, self.chunk)]
        values, mask = cat_padded_token_embeddings([o["token_embeddings"] for o in outputs],
                                                   [o["attention_mask"] for o in outputs])
        return {"token_embeddings": values, "attention_mask": mask}


def float64_scores(queries, documents, queries_mask, documents_mask, mean=False):
    """The peer's scorer contract (queries (Q, Lq, D), documents (Q, n, Ld, D) -> (Q, Q n) query-major) by the
    MaxSim formula in the inputs' dtype: the peer's own scorer rounds to float32."""
    q, n, length, width = documents.shape
    documents, documents_mask = documents.reshape(q * n, length, width), documents_mask.reshape(q * n, length)
    similarities = torch.einsum("aid,bjd->abij", queries, documents)  # (Q, Q n, Lq, Ld)
    best = similarities.masked_fill(~documents_mask[None, :, None, :], float("-inf")).max(dim=3).values
    scores = (best * queries_mask[:, None, :]).sum(dim=2)  # (Q, Q n)
    return scores / queries_mask.sum(dim=1, keepdim=True) if mean else scores


def loss_and_grads(model: nn.Module, loss: nn.Module, batch, seed: int = 11) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout draws for every loss
    with column_merging_disabled():  # one forward per column, as GradCache encodes them
        value = loss(copy.deepcopy(batch), None)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value.detach(), grads


@pytest.mark.parametrize("dropout", [False, True], ids=["dropout-off", "dropout-on"])
@pytest.mark.parametrize("columns, chunk, spelling, similarity", [
    (("anchor", "positive", "negative"), 3, {"chunk_size": 3}, "maxsim"),  # three chunks, the last of one row
    pytest.param(("anchor", "positive", "negative"), 2, {"mini_batch_size": 2, "scale": 2.0}, "maxsim",
                 marks=pytest.mark.slow),
    pytest.param(("anchor", "positive"), 7, {"chunk_size": 7, "temperature": 0.5, "tile_size": 2}, "maxsim",
                 marks=pytest.mark.slow),  # one chunk: the plain peer draws the same dropout masks
    pytest.param(("anchor", "positive", "negative", "negative"), 3,
                 {"mini_batch_size": 3, "temperature": 0.25, "score_mini_batch_size": 3}, "meanmaxsim",
                 marks=pytest.mark.slow),
], ids=["triplets-chunks-of-3", "peer-spelling", "pairs-one-chunk", "two-negative-columns-meanmaxsim"])
def test_equals_the_peers_uncached_loss_on_every_parameter(bert_folder, dropout, columns, chunk, spelling,
                                                           similarity):
    model = tiny_colbert(bert_folder, similarity).train(dropout)
    batch = features(model, columns)
    scale = spelling.get("scale", 1 / spelling.get("temperature", 1.0))
    mean = similarity == "meanmaxsim"
    ours = GradCacheMultiVectorLoss(model, **spelling)
    got_loss, got = loss_and_grads(model, ours, batch)
    # the peer's loss, uncached, over the model run in the same chunks (its dropout draws), MaxSim in float64
    reference = MultiVectorMultipleNegativesRankingLoss(
        Chunked(model, chunk), scale=scale, similarity_fct=partial(float64_scores, mean=mean))
    want_loss, want = loss_and_grads(model, reference, batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-10, atol=0)
    assert_close(got, want, 1e-9)
    if not dropout or chunk >= 7:  # the plain peer, its own scorer (float32) and forwards: same masks in one chunk
        peer_loss, peer = loss_and_grads(model, MultiVectorMultipleNegativesRankingLoss(model, scale=scale), batch)
        assert torch.allclose(got_loss, peer_loss.double(), rtol=1e-6, atol=0)  # the peer scores in float32
        assert_close(got, peer, 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"chunk_tokens": 30}, {"memory_budget": 200_000}], ids=["chunk_tokens", "budget"])
def test_the_memory_options_equal_the_peers_loss(bert_folder, options):
    model = tiny_colbert(bert_folder).eval()
    batch = features(model)
    _, want = loss_and_grads(model, MultiVectorMultipleNegativesRankingLoss(model, similarity_fct=float64_scores),
                             batch)
    _, got = loss_and_grads(model, GradCacheMultiVectorLoss(model, chunk_size=3, **options), batch)
    assert_close(got, want, 1e-9)


@pytest.mark.slow
def test_query_expansion_positions_are_scored_and_survive_trimming(bert_folder):
    """A chunk of short queries keeps its expansion columns: the loss depends on them, the peer's way."""
    model = tiny_colbert(bert_folder).eval()
    batch = features(model, ("anchor", "positive"))
    expansion, attended = batch[0]["query_expansion_positions"].bool(), batch[0]["attention_mask"].bool()
    assert expansion[:, -1].all() and not attended[:, -1].any()  # the last column: no query attends, all score it
    widths = []
    model[0].register_forward_pre_hook(lambda m, args: widths.append(args[0]["input_ids"].shape[1]))
    _, got = loss_and_grads(model, GradCacheMultiVectorLoss(model, chunk_size=2), batch)
    assert widths[0] == EXPANSION["length"]  # query chunks keep all 12 positions
    _, want = loss_and_grads(model, MultiVectorMultipleNegativesRankingLoss(model), batch)
    assert_close(got, want, 1e-6)


@pytest.mark.slow
def test_a_trainer_step_equals_the_peers_step(bert_folder, tmp_path):
    from sentence_transformers import MultiVectorEncoderTrainer, MultiVectorEncoderTrainingArguments

    def step(make_loss) -> dict:
        model = tiny_colbert(bert_folder)
        for module in model.modules():  # dropout off (the trainer calls train()): the uncached peer draws other masks
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        args = MultiVectorEncoderTrainingArguments(
            str(tmp_path / make_loss.__name__), per_device_train_batch_size=7, max_steps=1, learning_rate=0.5,
            optim="sgd", max_grad_norm=0.0, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, seed=3)
        data = datasets.Dataset.from_dict({c: COLUMNS[c][:7] for c in ("anchor", "positive", "negative")})
        trainer = MultiVectorEncoderTrainer(model=model, args=args, train_dataset=data, loss=make_loss(model))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer.train()
        moved = {n: p.detach() - before[n] for n, p in model.named_parameters()}
        assert any(m.abs().max() > 0 for m in moved.values())
        return moved

    def ours(model):
        return GradCacheMultiVectorLoss(model, mini_batch_size=3)

    def theirs(model):
        return MultiVectorMultipleNegativesRankingLoss(model)

    assert_close(step(ours), step(theirs), 1e-6)


@pytest.mark.slow
def test_dropout_on_equals_the_peers_cached_loss_step(bert_folder):
    """CachedMultiVectorMultipleNegativesRankingLoss at the same mini-batch size draws the same masks."""
    model = tiny_colbert(bert_folder).train()
    batch = features(model)
    got_loss, got = loss_and_grads(model, GradCacheMultiVectorLoss(model, chunk_size=3, tile_size=4), batch)
    want_loss, want = loss_and_grads(model, CachedMultiVectorMultipleNegativesRankingLoss(model, mini_batch_size=3),
                                     batch)
    assert torch.allclose(got_loss, want_loss.double(), rtol=1e-6)  # the peer scores in float32
    assert_close(got, want, 1e-6)


@pytest.mark.slow
def test_inside_multi_vector_matryoshka_loss(bert_folder):
    """MultiVectorMatryoshkaLoss truncates the cached token embeddings through calculate_loss, as for the peer's."""
    model = tiny_colbert(bert_folder).eval()
    batch = features(model)
    dims = [128, 32, 8]
    want_loss, want = loss_and_grads(
        model, MultiVectorMatryoshkaLoss(model, MultiVectorMultipleNegativesRankingLoss(model), dims), batch)
    got_loss, got = loss_and_grads(
        model, MultiVectorMatryoshkaLoss(model, GradCacheMultiVectorLoss(model, chunk_size=3), dims), batch)
    assert torch.allclose(got_loss, want_loss.double(), rtol=1e-6)  # the peer scores in float32
    assert_close(got, want, 1e-6)


def test_both_spellings_and_the_peers_defaults(bert_folder):
    model = tiny_colbert(bert_folder)
    default = GradCacheMultiVectorLoss(model)
    assert (default.temperature, default.scale, default.chunk_size, default.mini_batch_size) == (1.0, 1.0, 32, 32)
    assert default.options["trim_padding"] and default.loss.query_reduction == "sum"
    both = GradCacheMultiVectorLoss(model, temperature=0.05, scale=20.0, chunk_size=4, mini_batch_size=4,
                                    tile_size=8, score_mini_batch_size=8)
    assert (both.temperature, both.chunk_size, both.loss.tile_size) == (0.05, 4, 8)
    assert both.get_config_dict()["scale"] == pytest.approx(20.0)
    assert GradCacheMultiVectorLoss(tiny_colbert(bert_folder, "meanmaxsim")).loss.query_reduction == "mean"


@pytest.mark.parametrize("options, error, match", [
    ({"temperature": 0.5, "scale": 1.0}, ValueError, r"temperature=0\.5 and scale=1\.0, which disagree"),
    ({"chunk_size": 4, "mini_batch_size": 8}, ValueError, r"chunk_size=4 and mini_batch_size=8, which disagree"),
    ({"tile_size": 4, "score_mini_batch_size": 8}, ValueError, r"tile_size=4 and score_mini_batch_size=8, which disagree"),
    ({"chunk_size": 0}, ValueError, r"got chunk_size=0; chunk_size must be an int >= 1"),
    ({"mini_batch_size": 0}, ValueError, r"got mini_batch_size=0; mini_batch_size must be an int >= 1"),
    ({"mini_batch_size": 2.5}, TypeError, r"got mini_batch_size=2\.5; mini_batch_size must be an int >= 1"),
    ({"scale": -1.0}, ValueError, r"got scale=-1\.0; scale must be a finite number > 0"),
    ({"temperature": 0.0}, ValueError, r"got temperature=0\.0; temperature must be a finite number > 0"),
    ({"similarity_fct": float64_scores}, TypeError, r"Drop similarity_fct"),
    ({"mini_batch_num_tokens": 512}, TypeError, r"Pass chunk_tokens instead"),
    ({"scaler": torch.amp.GradScaler("cpu")}, TypeError, r"cannot honour"),
])
def test_bad_options_are_refused_by_name(bert_folder, options, error, match):
    with pytest.raises(error, match=match):
        GradCacheMultiVectorLoss(tiny_colbert(bert_folder), **options)



class _Pooled(nn.Module):
    """A model that returns one vector per text, as a dense SentenceTransformer does."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(30522, 4)

    def forward(self, features, task=None):
        return {"sentence_embedding": self.embedding(features["input_ids"]).mean(dim=1)}


def test_a_model_without_token_embeddings_is_refused_by_name():
    ids = torch.tensor([[101, 7, 102], [101, 8, 102]])
    column = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with pytest.raises(TypeError, match=r"needs the model's 'token_embeddings'.*got \['sentence_embedding'\]"):
        GradCacheMultiVectorLoss(_Pooled(), chunk_size=1)([column, dict(column)], None)


def ddp_worker(rank: int, world_size: int, folder: str) -> dict:
    """Each rank its own half of the rows, under DDP; both losses gather the documents of every rank."""
    from torch.nn.parallel import DistributedDataParallel

    results = {}
    for name in ("ours", "theirs"):
        model = tiny_colbert(folder).eval()
        wrapped = DistributedDataParallel(model)
        batch = [{k: v[rank * 4:(rank + 1) * 4] if isinstance(v, torch.Tensor) else v for k, v in f.items()}
                 for f in features(model, rows=8)]
        if name == "ours":
            loss = GradCacheMultiVectorLoss(model, chunk_size=2, gather_across_devices=True)
        else:
            loss = MultiVectorMultipleNegativesRankingLoss(model, gather_across_devices=True)
        loss.model = wrapped  # as the trainer's override_model_in_loss does
        wrapped.similarity = model.similarity
        _, grads = loss_and_grads(model, loss, batch)
        results[name] = {"grads": grads}  # what DDP averaged: the step's gradient
    return results


@pytest.mark.slow
def test_ddp_with_gathered_documents_equals_the_peers_gathered_loss(bert_folder):
    """Two gloo ranks of 4 rows (the peer gathers equal row counts only): the peer scores its rank's queries
    against every rank's documents; so does GradCache's gather, and DDP's average of the gradients is the same."""
    from tests.multiprocess import run_on_ranks

    for rank in run_on_ranks(ddp_worker, 2, str(bert_folder)):
        ours, theirs = rank["ours"], rank["theirs"]
        assert_close(ours["grads"], theirs["grads"], 1e-6)
