import pytest
import torch

from gradcache.models import ByteTokenizer, TextEncoder

TOKENIZER = ByteTokenizer(context_length=32)
TEXTS = ["a photo of a cat", "dog", "a much longer caption about a red bus", "ok"]


def _encoder(pooling="mean", **kwargs):
    torch.manual_seed(0)
    options = {"context_length": 32, "width": 32, "layers": 2, "heads": 2, "pooling": pooling, **kwargs}
    return TextEncoder(TOKENIZER.vocab_size, **options)


@pytest.mark.parametrize("pooling", ["mean", "cls", "eos"])
def test_shape_and_out_dim(pooling):
    encoder = _encoder(pooling)
    assert encoder.out_dim == 32
    assert encoder(**TOKENIZER(TEXTS)).shape == (len(TEXTS), 32)


@pytest.mark.parametrize("pooling", ["mean", "cls", "eos"])
@pytest.mark.parametrize("mode", ["train", "eval", "eval_no_grad"])
def test_trimming_trailing_padding_columns_does_not_change_the_output(pooling, mode):
    encoder = _encoder(pooling).train(mode == "train")
    batch = TOKENIZER(TEXTS)
    short = [1, 3]  # "dog" and "ok": their rows are mostly padding
    trimmed_length = int(batch["attention_mask"][short].sum(dim=1).max())
    trimmed = {name: value[short, :trimmed_length] for name, value in batch.items()}
    with torch.set_grad_enabled(mode != "eval_no_grad"):
        full = encoder(**batch)[short]
        cut = encoder(**trimmed)
    assert trimmed_length < batch["input_ids"].shape[1]
    torch.testing.assert_close(cut, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "eos"])
def test_token_ids_at_padded_positions_are_ignored(pooling):
    encoder = _encoder(pooling)
    batch = TOKENIZER(TEXTS)
    scrambled = dict(batch)
    padding = batch["attention_mask"] == 0
    scrambled["input_ids"] = torch.where(padding, torch.randint_like(batch["input_ids"], 3, 259), batch["input_ids"])
    torch.testing.assert_close(encoder(**scrambled), encoder(**batch))


def test_pooling_against_manual_computation_on_the_final_states():
    batch = TOKENIZER(TEXTS)
    states = {}
    encoders = {pooling: _encoder(pooling) for pooling in ("mean", "cls", "eos")}  # same seed: same weights
    encoders["mean"].final_norm.register_forward_hook(lambda _m, _i, out: states.__setitem__("x", out))
    pooled_mean = encoders["mean"](**batch)
    x, mask = states["x"], batch["attention_mask"]
    for row in range(len(TEXTS)):
        kept = [x[row, position] for position in range(x.shape[1]) if mask[row, position] == 1]
        torch.testing.assert_close(pooled_mean[row], torch.stack(kept).mean(dim=0))
    torch.testing.assert_close(encoders["cls"](**batch), x[:, 0])
    last = [int(mask[row].sum()) - 1 for row in range(len(TEXTS))]
    torch.testing.assert_close(encoders["eos"](**batch), torch.stack([x[row, last[row]] for row in range(len(TEXTS))]))
    assert all(batch["input_ids"][row, last[row]] == TOKENIZER.eos_id for row in range(len(TEXTS)))


def test_missing_attention_mask_means_every_token_is_kept():
    encoder = _encoder()
    ids = TOKENIZER(["abc", "xyz"])["input_ids"]
    torch.testing.assert_close(encoder(ids), encoder(ids, torch.ones_like(ids)))


def test_sequence_longer_than_context_length_raises():
    encoder = _encoder()
    with pytest.raises(ValueError, match="context_length=32"):
        encoder(torch.ones(1, 33, dtype=torch.long))


def test_mask_shape_mismatch_raises():
    encoder = _encoder()
    with pytest.raises(ValueError, match="attention_mask shape"):
        encoder(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs,match",
    [({"pooling": "max"}, "pooling='max'"), ({"width": 30, "heads": 4}, "heads=4"), ({"dropout": 1.0}, "dropout")],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _encoder(**kwargs)
