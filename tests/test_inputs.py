"""Splitting inputs, trimming padding, and the split_fn hook."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache, NaiveAccumulation
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
