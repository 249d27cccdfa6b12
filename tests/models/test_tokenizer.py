import pytest
import torch

from gradcache.models import ByteTokenizer

TEXTS = ["hello", "", "naïve café ☕", "a much longer sentence than the others"]


def test_round_trip_and_layout():
    tokenizer = ByteTokenizer(context_length=64)
    batch = tokenizer(TEXTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.dtype == mask.dtype == torch.long
    longest = max(len(text.encode("utf-8")) for text in TEXTS) + 2
    assert ids.shape == mask.shape == (len(TEXTS), longest)
    for row, text in enumerate(TEXTS):
        expected = [1] + [byte + 3 for byte in text.encode("utf-8")] + [2]
        length = len(expected)
        assert ids[row, :length].tolist() == expected
        assert ids[row, length:].eq(tokenizer.pad_id).all()
        assert mask[row].tolist() == [1] * length + [0] * (longest - length)
        assert tokenizer.decode(ids[row]) == text


def test_special_ids_and_vocab_size():
    tokenizer = ByteTokenizer()
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    assert tokenizer.vocab_size == 259
    assert int(tokenizer(["\xff" * 3 + "\x00"])["input_ids"].max()) < tokenizer.vocab_size


def test_pads_only_to_the_longest_text_in_the_batch():
    batch = ByteTokenizer(context_length=64)(["ab", "abcd"])
    assert batch["input_ids"].shape == (2, 6)


def test_truncation_keeps_eos_and_never_exceeds_context_length():
    tokenizer = ByteTokenizer(context_length=8)
    batch = tokenizer(["abcdefghijkl", "ab"])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (2, 8)
    assert ids[0].tolist() == [1] + [byte + 3 for byte in b"abcdef"] + [2]
    assert mask[0].all()
    assert tokenizer.decode(ids[0]) == "abcdef"


def test_truncation_inside_a_multibyte_character_decodes_without_error():
    tokenizer = ByteTokenizer(context_length=4)  # room for two bytes: "a" and half of "é"
    ids = tokenizer(["aé"])["input_ids"][0]
    assert ids[-1].item() == tokenizer.eos_id
    assert tokenizer.decode(ids) == "a\ufffd"


@pytest.mark.parametrize("texts,error", [("hello", TypeError), ([], ValueError), (["a", 3], TypeError)])
def test_bad_texts(texts, error):
    with pytest.raises(error, match="texts"):
        ByteTokenizer()(texts)


@pytest.mark.parametrize("context_length", [2, 0, 3.5])
def test_bad_context_length(context_length):
    with pytest.raises(ValueError, match="context_length"):
        ByteTokenizer(context_length=context_length)
