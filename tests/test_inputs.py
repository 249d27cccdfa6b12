"""Splitting inputs, trimming padding, and the split_fn hook."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gradcache import FullBatch, GradCache
from gradcache.inputs import split, trim_padding
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
