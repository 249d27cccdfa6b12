"""HuggingFaceTokenizer cuts a text to what `max_length` tokens can cover before its tokenizer reads it: a row of
hundreds of megabytes would otherwise be tokenised whole (the Rust tokenizer aborts the process), and the tokens
kept are those of the whole text truncated."""
import pytest
import torch

from gradcache.models import HuggingFaceTokenizer
from gradcache.models.hf_tokenizer import CHARACTERS_PER_TOKEN

ORDINARY = ["a query", "a longer passage about the weather in paris, with digits 0123 and punctuation!?",
            "", "x", "many   spaces\tand\ttabs\nand lines"]


def _whole_then_truncated(tokenize, texts):
    """What the folder's own tokenizer gives for the whole texts, truncated to `max_length` after."""
    batch = tokenize.tokenizer(texts, padding="longest", truncation=True, max_length=tokenize.max_length,
                               return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("max_length", [2, 8, 32])
def test_the_tokens_of_ordinary_and_long_texts_are_those_of_the_whole_text(tiny_bert, max_length):
    tokenize = HuggingFaceTokenizer(tiny_bert, max_length=max_length)
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 2000)  # 88,000 characters
    glued = "abc" * 30_000  # one word, tokenised character by character
    for texts in (ORDINARY, [long, "short", glued]):
        batch = tokenize(texts)
        expected_ids, expected_mask = _whole_then_truncated(tokenize, texts)
        assert torch.equal(batch["input_ids"], expected_ids) and torch.equal(batch["attention_mask"], expected_mask)


def test_a_huge_text_reaches_the_tokenizer_cut_to_what_max_length_tokens_cover(tiny_bert):
    tokenize = HuggingFaceTokenizer(tiny_bert, max_length=16)
    seen, tokenizer = [], tokenize.tokenizer

    def recording(texts, **options):
        seen.extend(len(text) for text in texts)
        return tokenizer(texts, **options)

    tokenize.tokenizer = recording
    huge = "word " * 2_000_000  # 10 MB
    batch = tokenize([huge, "a query"])
    assert max(seen) == 16 * CHARACTERS_PER_TOKEN and seen[1] == len("a query")
    assert batch["input_ids"].shape == (2, 16)
