"""Splitting inputs, trimming padding, and the split_fn hook."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation, RecomputationMismatchError
from gradcache.inputs import split, trim_padding
from gradcache.token_chunks import cut
from gradcache.losses import ClipLoss
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, mlp, tokens, zero


def test_split_tensor_mapping_and_sequence_along_dim_0():
    x = torch.arange(10)
    assert [c.tolist() for c in split(x, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    mapping = split({"a": x, "b": x * 2}, 6)
    assert [c["b"].tolist() for c in mapping] == [[0, 2, 4, 6, 8, 10], [12, 14, 16, 18]]
    sequence = split((x, x + 1), 9)
    assert isinstance(sequence[0], tuple) and sequence[1][1].tolist() == [10]


def test_split_refuses_unknown_types_without_a_hook():
    with pytest.raises(TypeError, match="split_fn"):
        split("a batch of strings", 4)


def test_trim_padding_drops_columns_that_are_padding_in_every_row():
    chunk = {"input_ids": torch.tensor([[5, 6, 0, 0, 0], [7, 0, 0, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])}
    trimmed = trim_padding(chunk)
    assert trimmed["input_ids"].tolist() == [[5, 6], [7, 0]]
    assert trimmed["attention_mask"].shape == (2, 2)
    assert trim_padding(torch.ones(2, 3)).shape == (2, 3)  # not a mapping: unchanged


def test_trim_padding_is_exact_for_an_encoder_that_ignores_masked_positions():
    torch.manual_seed(0)
    image, text = mlp().double().eval(), TokenEncoder().double().eval()
    loss = ClipLoss().double()
    batch = (torch.randn(12, 10, dtype=torch.float64), tokens(12, length=16, seed=3))
    zero(image, text, loss)
    FullBatch([image, text], loss).step(*batch)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    text.seen_lengths.clear()
    GradCache([image, text], loss, 3, trim_padding=True).step(*batch)
    assert min(text.seen_lengths) < 16  # some chunk was actually trimmed
    assert_grads_close(grads_of(image, text, loss), want, 1e-12)


@dataclass
class Pairs:
    """A user's own batch type, split by the user's hook."""

    left: torch.Tensor

    def __len__(self):
        return len(self.left)


def test_split_fn_hook_handles_a_custom_input_type():
    torch.manual_seed(1)

    class PairsEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, pairs: Pairs):
            return self.net(pairs.left)

    encoder = PairsEncoder().double()
    loss = ClipLoss().double()
    a, b = Pairs(torch.randn(9, 10).double()), Pairs(torch.randn(9, 10).double())
    zero(encoder, loss)
    FullBatch(encoder, loss).step(a, b)
    want = grads_of(encoder, loss)
    zero(encoder, loss)
    hook = lambda pairs, size: [Pairs(t) for t in pairs.left.split(size)]  # noqa: E731
    GradCache(encoder, loss, 4, split_fn=hook).step(a, b)
    assert_grads_close(grads_of(encoder, loss), want, 1e-12)


LABELS = ("cat", "dog", "fish")


class LabelledText(TokenEncoder):
    """A text tower that reads two per-example lists (a label and a scale per row) and two per-batch settings
    (a string and a tuple of another length), all through the mapping input."""

    def __init__(self):
        super().__init__()
        self.offsets = torch.nn.Embedding(len(LABELS), 6)

    def forward(self, input_ids, attention_mask, labels, scales, mode, mix):
        assert mode == "scaled" and mix == (0.5, 2.0)  # per-batch settings reach every chunk whole
        ids = torch.tensor([LABELS.index(label) for label in labels])  # (B,): one per row, or a shape error
        scale = torch.tensor(scales, dtype=self.proj.weight.dtype)[:, None]  # (B, 1)
        return mix[0] * super().forward(input_ids, attention_mask) * scale + mix[1] * self.offsets(ids)


def labelled_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    text = tokens(n, length=12, seed=seed)
    text["labels"] = [LABELS[int(i)] for i in torch.randint(0, 3, (n,), generator=g)]
    text["scales"] = tuple(float(s) for s in torch.rand(n, generator=g) + 0.5)
    text["mode"], text["mix"] = "scaled", (0.5, 2.0)
    return torch.randn(n, 10, dtype=torch.float64, generator=g), text


PER_EXAMPLE_CASES = {
    "gradcache": (GradCache, {}),
    "budget": (GradCache, {"memory_budget": 3000}),
    "tokens": (GradCache, {"chunk_tokens": [None, 20]}),
    "tokens+budget": (GradCache, {"chunk_tokens": [None, 20], "memory_budget": 3000}),
    "trim": (GradCache, {"trim_padding": True}),
    "cached": (CachedLoss, {"trim_padding": True}),
}


@pytest.mark.parametrize("case", list(PER_EXAMPLE_CASES))
def test_per_example_lists_in_a_mapping_are_split_like_the_tensors(case):
    torch.manual_seed(0)
    image, text = mlp().double().eval(), LabelledText().double().eval()
    loss = ClipLoss(temperature=0.1, learnable=True).double()
    batch = labelled_batch(13, seed=2)
    zero(image, text, loss)
    want_loss = FullBatch([image, text], loss).step(*batch)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    cls, options = PER_EXAMPLE_CASES[case]
    if cls is CachedLoss:
        got_loss = cls([image, text], loss, 4, **options)(*batch)
        got_loss.backward()
    else:
        got_loss = cls([image, text], loss, 4, **options).step(*batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(image, text, loss), want, 1e-12)


def test_naive_accumulation_splits_per_example_lists_into_its_micro_batches():
    """Against its own definition, written out: FullBatch on each micro-batch, sliced by hand, divided by the count."""
    torch.manual_seed(0)
    image, text = mlp().double().eval(), LabelledText().double().eval()
    loss = ClipLoss(temperature=0.1, learnable=True).double()
    x, t = labelled_batch(10, seed=3)
    zero(image, text, loss)
    for start in range(0, 10, 4):
        rows = slice(start, start + 4)
        part = {k: v[rows] if k not in ("mode", "mix") else v for k, v in t.items()}
        FullBatch([image, text], lambda a, b: loss(a, b) / 3).step(x[rows], part)
    want = grads_of(image, text, loss)
    zero(image, text, loss)
    NaiveAccumulation([image, text], loss, 4).step(x, t)
    assert_grads_close(grads_of(image, text, loss), want, 1e-12)


def test_split_and_token_chunks_carry_per_example_lists_with_their_rows():
    value = {"x": torch.arange(5), "labels": list("abcde"), "ids": (10, 11, 12, 13, 14), "flag": "abcde"[:2],
             "pair": [1, 2]}
    chunks = split(value, 2)
    assert [c["labels"] for c in chunks] == [["a", "b"], ["c", "d"], ["e"]]
    assert [c["ids"] for c in chunks] == [(10, 11), (12, 13), (14,)]
    assert all(c["flag"] == "ab" and c["pair"] == [1, 2] for c in chunks)  # per-batch settings: whole
    sequence = split((torch.arange(5), ["a", "b", "c", "d", "e"], 3.0), 3)
    assert sequence[1][1] == ["d", "e"] and sequence[1][2] == 3.0
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]])
    text = {"input_ids": mask * 7, "attention_mask": mask, "labels": ["short", "long", "middle"], "k": [0, 1]}
    sorted_chunks = cut(text, torch.tensor([1, 2, 0]), [2, 1])
    assert [c["labels"] for c in sorted_chunks] == [["long", "middle"], ["short"]]
    assert all(c["k"] == [0, 1] for c in sorted_chunks)


@pytest.mark.parametrize("cls", [GradCache, CachedLoss, NaiveAccumulation, FullBatch])
@pytest.mark.parametrize(
    "entry, match",
    [(range(6), r"input 0\['labels'\] is a range of 6 entries.*list\(value\)"),
     ([torch.zeros(6, 2), torch.zeros(6, 2)], r"input 0\['labels'\] is a list holding tensors of 6 rows"),
     ({"nested": torch.zeros(6)}, r"input 0\['labels'\] is a dict holding tensors of 6 rows")],
)
def test_values_that_cannot_be_split_safely_are_refused_before_anything_runs(cls, entry, match):
    encoder = torch.nn.Linear(3, 4)
    strategy = cls(encoder, lambda a, b: (a * b).sum(), 4)
    run = strategy if cls is CachedLoss else strategy.step
    with pytest.raises(TypeError, match=match):
        run({"x": torch.randn(6, 3), "labels": entry}, {"x": torch.randn(6, 3)})
    assert all(p.grad is None for p in encoder.parameters())


# --- the input forms of the original GradCache (luyug/GradCache) ---------------------------------------------

def two_towers(seed=0):
    torch.manual_seed(seed)
    return mlp().double().eval(), TokenEncoder().double().eval(), ClipLoss(temperature=0.1, learnable=True).double()


def full_batch_grads(encoders, loss, batch, **options):
    modules = [*encoders, loss] if isinstance(encoders, list) else [encoders, loss]
    zero(*modules)
    value = FullBatch(encoders, loss, **options).step(*batch)
    return value, grads_of(*modules)


def chunked_grads(cls, encoders, loss, batch, chunk_size, **options):
    modules = [*encoders, loss] if isinstance(encoders, list) else [encoders, loss]
    zero(*modules)
    if cls is CachedLoss:
        value = CachedLoss(encoders, loss, chunk_size, **options)(*batch)
        value.backward()
        value = value.detach()
    else:
        value = cls(encoders, loss, chunk_size, **options).step(*batch)
    return value, grads_of(*modules)


@pytest.mark.parametrize("cls", [GradCache, CachedLoss])
@pytest.mark.parametrize("per_input", [False, True])
def test_split_fn_splits_tensor_and_mapping_inputs_when_given(cls, per_input):
    """The hook is honoured for every input it is given for (it was silently ignored for tensors): its own
    uneven chunks, not chunk_size's, and the full-batch gradient on every parameter."""
    image, text, loss = two_towers()
    batch = (torch.randn(9, 10, dtype=torch.float64), tokens(9, seed=1))
    calls = []

    def first_two_then_rest(value, chunk_size):  # not chunk_size's chunks
        calls.append(type(value).__name__)
        if isinstance(value, dict):
            return [{k: v[:2] for k, v in value.items()}, {k: v[2:] for k, v in value.items()}]
        return (value[:2], value[2:])

    split_fn = [first_two_then_rest, None] if per_input else first_two_then_rest
    want_loss, want = full_batch_grads([image, text], loss, batch)
    seen = []
    image.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[0]))
    got_loss, got = chunked_grads(cls, [image, text], loss, batch, 4, split_fn=split_fn)
    assert calls == (["Tensor"] if per_input else ["Tensor", "dict"])
    assert seen == [2, 7, 2, 7]  # phases (1) and (3) ran the hook's chunks
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(got, want, 1e-12)


def test_naive_accumulation_takes_its_micro_batches_from_split_fn():
    """Against its definition written out on the hook's chunks: micro-batch k is chunk k of every input."""
    torch.manual_seed(2)
    encoder, loss = mlp().double().eval(), ClipLoss(temperature=0.2).double()
    a, b = torch.randn(2, 8, 10, dtype=torch.float64)
    hook = lambda value, size: [value[:3], value[3:]]  # noqa: E731
    zero(encoder)
    for rows in (slice(0, 3), slice(3, 8)):
        FullBatch(encoder, lambda x, y: loss(x, y) / 2).step(a[rows], b[rows])
    want = grads_of(encoder)
    zero(encoder)
    NaiveAccumulation(encoder, loss, 4, split_fn=hook).step(a, b)
    assert_grads_close(grads_of(encoder), want, 1e-12)


class ArgsAndKeywords(torch.nn.Module):
    """A text tower called as encoder(input_ids, extra, attention_mask=..., scale=..., labels=...)."""

    def __init__(self):
        super().__init__()
        self.text = TokenEncoder()
        self.extra = torch.nn.Linear(3, 6)
        self.offsets = torch.nn.Embedding(len(LABELS), 6)

    def forward(self, input_ids, extra, *, attention_mask, scale, labels):
        ids = torch.tensor([LABELS.index(label) for label in labels])  # (B,): one per row
        return scale * self.text(input_ids, attention_mask) + self.extra(extra) + self.offsets(ids)


def args_and_keywords_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    text = tokens(n, length=12, seed=seed)
    labels = [LABELS[int(i)] for i in torch.randint(0, 3, (n,), generator=g)]
    args = [text["input_ids"], torch.randn(n, 3, dtype=torch.float64, generator=g)]
    keywords = {"attention_mask": text["attention_mask"], "scale": 0.5, "labels": labels}
    return torch.randn(n, 10, dtype=torch.float64, generator=g), (args, keywords)


@pytest.mark.parametrize("cls, options", [(GradCache, {}), (CachedLoss, {}), (GradCache, {"memory_budget": 16000}),
                                          (GradCache, {"trim_padding": True})],
                         ids=["gradcache", "cached", "budget", "trim"])
def test_args_and_kwargs_pair_is_encoder_of_args_and_kwargs(cls, options):
    """(args, kwargs) reaches the encoder as encoder(*args, **kwargs), split with its rows (a per-example list
    included, a per-batch number whole); trim_padding cuts positional and keyword tensors alike."""
    torch.manual_seed(3)
    image, text = mlp().double().eval(), ArgsAndKeywords().double().eval()
    loss = ClipLoss(temperature=0.1, learnable=True).double()
    batch = args_and_keywords_batch(11, seed=4)
    want_loss, want = full_batch_grads([image, text], loss, batch)
    text.text.seen_lengths.clear()
    got_loss, got = chunked_grads(cls, [image, text], loss, batch, 4, **options)
    if options.get("trim_padding"):
        assert min(text.text.seen_lengths) < 12  # some chunk was actually trimmed
    if options.get("memory_budget"):
        assert 3 < len(text.text.seen_lengths) < 6  # 3 chunks: some kept, some re-encoded
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(got, want, 1e-12)


def test_naive_accumulation_splits_an_args_and_kwargs_pair():
    torch.manual_seed(5)
    image, text = mlp().double().eval(), ArgsAndKeywords().double().eval()
    loss = ClipLoss(temperature=0.1).double()
    x, (args, keywords) = args_and_keywords_batch(8, seed=6)
    zero(image, text)
    for rows in (slice(0, 4), slice(4, 8)):
        part = ([a[rows] for a in args], {**keywords, "attention_mask": keywords["attention_mask"][rows],
                                          "labels": keywords["labels"][rows]})
        FullBatch([image, text], lambda a, b: loss(a, b) / 2).step(x[rows], part)
    want = grads_of(image, text)
    zero(image, text)
    NaiveAccumulation([image, text], loss, 4).step(x, (args, keywords))
    assert_grads_close(grads_of(image, text), want, 1e-12)


class TwoEmbeddings(torch.nn.Module):
    """A text tower with two outputs: a pooled embedding (B, 6) and two half-width rows per example (2B, 3)."""

    def __init__(self, as_dict):
        super().__init__()
        self.text, self.as_dict = TokenEncoder(), as_dict

    def forward(self, input_ids, attention_mask):
        pooled = self.text(input_ids, attention_mask)  # (B, 6)
        halves = torch.tanh(pooled).reshape(-1, 3)  # (2B, 3)
        return {"pooled": pooled, "halves": halves, "note": "unused"} if self.as_dict else (pooled, halves)


def two_embedding_loss(clip):
    def loss(image, pooled, halves):  # image (N, 6), pooled (N, 6), halves (2N, 3)
        return clip(image, pooled) + 0.5 * clip(image[:, :3].repeat_interleave(2, 0), halves)
    return loss


MULTI_CASES = {
    "gradcache": (GradCache, {}), "cached": (CachedLoss, {}), "budget": (GradCache, {"memory_budget": 16000}),
    "naive_one_chunk": (NaiveAccumulation, {}),
}


@pytest.mark.parametrize("case", list(MULTI_CASES))
def test_get_embedding_returning_several_tensors_gives_one_loss_argument_each(case):
    """get_embedding may return a tuple: each tensor is a loss argument of its own, concatenated over the
    chunks by its own rows (here 2 per example), with the full-batch gradient on every parameter."""
    torch.manual_seed(7)
    image, text = mlp().double().eval(), TwoEmbeddings(as_dict=True).double().eval()
    clip = ClipLoss(temperature=0.1, learnable=True).double()
    loss = two_embedding_loss(clip)
    batch = (torch.randn(10, 10, dtype=torch.float64), tokens(10, seed=8))
    pick = lambda output: output if torch.is_tensor(output) else (output["pooled"], output["halves"])  # noqa: E731
    modules = [image, text, clip]
    zero(*modules)
    want_loss = FullBatch([image, text], loss, get_embedding=pick).step(*batch)
    want = grads_of(*modules)
    cls, options = MULTI_CASES[case]
    chunk = 10 if cls is NaiveAccumulation else 3  # one micro-batch: the full batch, by definition
    zero(*modules)
    text.text.seen_lengths.clear()
    if cls is CachedLoss:
        got_loss = CachedLoss([image, text], loss, chunk, get_embedding=pick, **options)(*batch)
        got_loss.backward()
    else:
        got_loss = cls([image, text], loss, chunk, get_embedding=pick, **options).step(*batch)
    if options.get("memory_budget"):
        assert 4 < len(text.text.seen_lengths) < 8  # 4 chunks: some kept, some re-encoded    assert want["2.logit_scale"].abs().item() > 0
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(*modules), want, 1e-12)


@pytest.mark.parametrize("chunk_size", [1, 4])
def test_cached_loss_with_an_encoder_returning_a_tuple(chunk_size):
    """The cached form (luyug's `cached` function returning a tuple): an encoder whose output is a tuple of
    tensors, no get_embedding, each tensor a loss argument."""
    torch.manual_seed(9)
    image, text = mlp().double().eval(), TwoEmbeddings(as_dict=False).double().eval()
    clip = ClipLoss(temperature=0.1, learnable=True).double()
    loss = two_embedding_loss(clip)
    batch = (torch.randn(7, 10, dtype=torch.float64), tokens(7, seed=10))
    zero(image, text, clip)
    want_loss = FullBatch([image, text], loss).step(*batch)
    want = grads_of(image, text, clip)
    zero(image, text, clip)
    got_loss = CachedLoss([image, text], loss, chunk_size)(*batch)
    got_loss.backward()
    assert torch.allclose(got_loss.detach(), want_loss, rtol=1e-12)
    assert_grads_close(grads_of(image, text, clip), want, 1e-12)


class Varying(torch.nn.Module):
    """Returns one embedding, or two from its `switch`-th call on (a count that varies where it must not)."""

    def __init__(self, switch):
        super().__init__()
        self.linear, self.calls, self.switch = torch.nn.Linear(10, 6), 0, switch

    def forward(self, x):
        self.calls += 1
        out = self.linear(x)
        return (out, out * 2) if self.calls >= self.switch else out


def one_step(options=None, encoder=None, inputs=None, chunk_size=3, loss=None):
    encoder = encoder if encoder is not None else torch.nn.Linear(10, 6)
    inputs = inputs if inputs is not None else (torch.randn(6, 10), torch.randn(6, 10))
    loss = loss if loss is not None else (lambda *embeddings: sum((e * e).sum() for e in embeddings))
    strategy = GradCache(encoder, loss, chunk_size, **(options or {}))
    return encoder, lambda: strategy.step(*inputs)


TEXT = tokens(6, length=8, seed=11)
BAD_FORMS = {
    "get_embedding gives None": ({"get_embedding": lambda out: (out, None)}, TypeError,
                                 "NoneType at position 1 of the tuple"),
    "get_embedding gives ()": ({"get_embedding": lambda out: ()}, TypeError, "empty tuple"),
    "0-dim embedding": ({"get_embedding": lambda out: out.sum()}, TypeError, "0-dimensional tensor"),
    "split_fn gives a tensor": ({"split_fn": lambda value, size: value}, TypeError,
                                "split_fn returned a Tensor for input 0"),
    "split_fn gives nothing": ({"split_fn": lambda value, size: []}, ValueError, "no chunks for input 0"),
    "split_fn too short": ({"split_fn": [None]}, ValueError, "split_fn has 1 entries for 2 inputs"),
    "split_fn and chunk_tokens": ({"split_fn": lambda v, s: [v], "chunk_tokens": 12}, ValueError,
                                  "chunk_tokens=12 and split_fn both apply to input 0"),
}


@pytest.mark.parametrize("case", list(BAD_FORMS))
def test_bad_input_forms_are_refused_before_any_gradient(case):
    options, error, match = BAD_FORMS[case]
    inputs = (TEXT, TEXT) if "chunk_tokens" in options else None
    encoder = TokenEncoder() if inputs else None
    encoder, step = one_step(options, encoder, inputs)
    with pytest.raises(error, match=match):
        step()
    assert all(p.grad is None for p in encoder.parameters())


def test_split_fn_that_is_not_callable_is_refused_at_construction():
    with pytest.raises(TypeError, match=r"split_fn\[1\] must be callable or None .* got 3"):
        GradCache(torch.nn.Linear(2, 2), lambda a, b: a.sum(), 2, split_fn=[None, 3])
    with pytest.raises(TypeError, match="split_fn must be callable, None, or one callable"):
        GradCache(torch.nn.Linear(2, 2), lambda a, b: a.sum(), 2, split_fn="rows")


def test_several_embeddings_must_be_as_many_per_chunk_and_the_same_on_recomputation():
    encoder, step = one_step(encoder=Varying(switch=2))  # chunk 2 of input 0 gives two
    with pytest.raises(TypeError, match="1 embedding\\(s\\) for its first chunk and 2 for chunk 2"):
        step()
    assert all(p.grad is None for p in encoder.parameters())
    encoder, step = one_step(encoder=Varying(switch=3), inputs=(torch.randn(6, 10),))  # phase (3) gives two
    with pytest.raises(RecomputationMismatchError, match="into 2 embeddings, but phase \\(1\\) got 1"):
        step()
    assert all(p.grad is None for p in encoder.parameters())


def test_chunk_tokens_refuses_an_embedding_without_one_row_per_example():
    encoder, step = one_step({"chunk_tokens": 12}, TwoEmbeddings(as_dict=False), (TEXT,))
    with pytest.raises(TypeError, match="12 rows for 6 examples; chunk_tokens sorts the examples"):
        step()
    assert all(p.grad is None for p in encoder.parameters())


def test_the_same_encoder_listed_twice_is_a_shared_encoder():
    """luyug's tied encoder, `models=[encoder, encoder]`: the full-batch gradient, as for one shared module."""
    torch.manual_seed(12)
    encoder, loss = mlp().double().eval(), ClipLoss(temperature=0.1, learnable=True).double()
    batch = tuple(torch.randn(2, 7, 10, dtype=torch.float64))
    want_loss, want = full_batch_grads(encoder, loss, batch)
    zero(encoder, loss)
    got_loss = GradCache([encoder, encoder], loss, 3).step(*batch)
    assert torch.allclose(got_loss, want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder, loss), want, 1e-12)
