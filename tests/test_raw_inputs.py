"""Raw non-tensor inputs: lists of strings (or text pairs) for an encoder that tokenises itself, and ready-made
sub-batches given with split_fn; gradients against one backward over the batch encoded chunk by chunk with a
graph from the same seed (dropout on, float64); messages that never ask for what the user passed."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import InfoNCE
from tests.conftest import TokenEncoder, assert_grads_close, grads_of, tokens, zero

WORDS = "a cat sat on the mat dogs run fast in parks sun is bright rain again green tea old bridges".split()


class Tokenising(nn.Module):
    """Takes a list of strings (or of text pairs, joined), tokenises them itself and embeds them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tower = TokenEncoder(vocab=len(WORDS) + 1).double().train()  # dropout on

    def forward(self, texts: list[str] | list[tuple[str, str]]) -> torch.Tensor:
        assert isinstance(texts, list) and texts, texts  # reaches the encoder whole, as a list
        texts = [" ".join(t) if isinstance(t, tuple) else t for t in texts]
        ids = [[WORDS.index(w) + 1 for w in t.split()] for t in texts]
        width = max(len(i) for i in ids)
        input_ids = torch.tensor([i + [0] * (width - len(i)) for i in ids])
        return self.tower(input_ids, (input_ids != 0).long())


def sentences(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[int(k)] for k in torch.randint(0, len(WORDS), (int(length),), generator=g))
            for length in torch.randint(1, 6, (n,), generator=g)]


def reference(encoder: nn.Module, loss_fn: nn.Module, inputs, chunk_size: int):
    zero(encoder)
    torch.manual_seed(5)
    embeddings = [torch.cat([encoder(v[s : s + chunk_size]) for s in range(0, len(v), chunk_size)]) for v in inputs]
    value = loss_fn(*embeddings)
    value.backward()
    return value.detach(), grads_of(encoder)


@pytest.mark.parametrize("split_fn", [None, lambda value, size: [value[s : s + size] for s in range(0, len(value), size)]])
@pytest.mark.parametrize("door", ["step", "cached_loss"])
def test_a_list_of_strings_reaches_a_tokenising_encoder_in_chunks(split_fn, door):
    encoder, loss_fn = Tokenising(), InfoNCE(temperature=0.1)
    inputs = sentences(7, seed=1), sentences(7, seed=2)
    want_loss, want = reference(encoder, loss_fn, inputs, 3)
    zero(encoder)
    torch.manual_seed(5)
    options = {} if split_fn is None else {"split_fn": split_fn}
    if door == "step":
        got_loss = GradCache(encoder, loss_fn, 3, **options).step(*inputs)
    else:
        got_loss = CachedLoss(encoder, loss_fn, 3, **options)(*inputs)
        got_loss.backward()
    assert torch.allclose(got_loss.detach(), want_loss, rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-10)


def test_text_pairs_and_fullbatch_take_raw_texts_too():
    encoder, loss_fn = Tokenising(), InfoNCE(temperature=0.1)
    encoder.eval()
    queries = sentences(5, seed=3)
    pairs = list(zip(sentences(5, seed=4), sentences(5, seed=5)))
    zero(encoder)
    full = FullBatch(encoder, loss_fn).step(queries, pairs)
    full_grads = grads_of(encoder)
    zero(encoder)
    cached = GradCache(encoder, loss_fn, 2).step(queries, pairs)
    assert torch.allclose(cached, full, rtol=1e-12)
    assert_grads_close(grads_of(encoder), full_grads, 1e-10)


def test_ready_made_sub_batches_with_split_fn_are_taken_as_given():
    """The issue's case: a list of tokenized sub-batches with split_fn returning them was refused with a message
    asking for split_fn."""
    encoder, loss_fn = TokenEncoder().double().train(), InfoNCE(temperature=0.1)
    xs = [tokens(3, seed=1), tokens(2, seed=2), tokens(3, seed=3)]
    ys = [tokens(3, seed=4), tokens(2, seed=5), tokens(3, seed=6)]
    zero(encoder)
    torch.manual_seed(5)
    want_loss = loss_fn(torch.cat([encoder(**x) for x in xs]), torch.cat([encoder(**y) for y in ys]))
    want_loss.backward()
    want = grads_of(encoder)
    zero(encoder)
    torch.manual_seed(5)
    got_loss = GradCache(encoder, loss_fn, 3, split_fn=lambda value, size: value).step(xs, ys)
    assert torch.allclose(got_loss, want_loss.detach(), rtol=1e-12)
    assert_grads_close(grads_of(encoder), want, 1e-10)


def test_messages_ask_for_split_fn_or_chunks_only_when_neither_was_given():
    encoder = TokenEncoder()
    sub_batches = [tokens(2, seed=1), tokens(2, seed=2)]
    with pytest.raises(ValueError, match=r"holds no tensor.*gradcache\.Chunks.*split_fn"):
        GradCache(encoder, InfoNCE(), 2).step(sub_batches, sub_batches)
    with pytest.raises(ValueError, match="different lengths.*give split_fn"):
        GradCache(encoder, InfoNCE(), 2).step({"input_ids": torch.zeros(3, 4), "attention_mask": torch.zeros(2, 4)})
    # given split_fn, the library checks nothing of the input's structure: the user's chunks decide
    strategy = GradCache(encoder, InfoNCE(), 2, split_fn=lambda value, size: value)
    assert strategy.check_inputs((sub_batches, sub_batches)) == [None, None]
    uneven = {"input_ids": torch.zeros(3, 4), "attention_mask": torch.zeros(2, 4)}
    assert strategy.check_inputs((uneven,)) == [None]
    assert encoder.proj.weight.grad is None
