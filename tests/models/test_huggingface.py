import sys

import pytest
import torch

from gradcache.models import HuggingFaceEncoder

@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory):
    """A tiny randomly initialised BERT written to disk: the wrapper loads it back, nothing is downloaded."""
    transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertModel(config).eval()
    path = tmp_path_factory.mktemp("tiny_bert")
    model.save_pretrained(path)
    return path, model


def _batch():
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, 40, (3, 7), generator=generator)
    attention_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    return input_ids, attention_mask


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_from_local_path_against_manual_computation(saved_bert, pooling):
    path, reference = saved_bert
    encoder = HuggingFaceEncoder(path, pooling=pooling).eval()
    assert encoder.out_dim == 16
    input_ids, attention_mask = _batch()
    pooled = encoder(input_ids, attention_mask)
    with torch.no_grad():
        hidden = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    for row in range(input_ids.shape[0]):
        kept = [hidden[row, position] for position in range(7) if attention_mask[row, position] == 1]
        expected = torch.stack(kept).mean(dim=0) if pooling == "mean" else hidden[row, 0]
        torch.testing.assert_close(pooled[row], expected, rtol=1e-5, atol=1e-5)


def test_accepts_an_already_built_model(saved_bert):
    _, reference = saved_bert
    encoder = HuggingFaceEncoder(reference, pooling="mean")
    assert encoder.model is reference
    input_ids, attention_mask = _batch()
    assert encoder(input_ids, attention_mask).shape == (3, 16)


def test_trailing_padding_columns_do_not_change_mean_pooling(saved_bert):
    path, _ = saved_bert
    encoder = HuggingFaceEncoder(path).eval()
    input_ids, attention_mask = _batch()
    full = encoder(input_ids[1:], attention_mask[1:])
    trimmed = encoder(input_ids[1:, :4], attention_mask[1:, :4])
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-5)


def test_grad_checkpointing_gives_identical_outputs_and_gradients(saved_bert):
    path, _ = saved_bert
    plain, checkpointed = HuggingFaceEncoder(path).train(), HuggingFaceEncoder(path).train()
    checkpointed.set_grad_checkpointing(True)
    input_ids, attention_mask = _batch()
    outputs, calls = [], []
    for encoder in (plain, checkpointed):
        calls.append([])
        # transformers checkpoints a layer's forward, so hooks on the layer itself fire once; a hook on a
        # submodule inside it also fires when the layer is recomputed.
        for layer in encoder.model.encoder.layer:
            layer.attention.register_forward_pre_hook(lambda *_, seen=calls[-1]: seen.append(1))
        output = encoder(input_ids, attention_mask)
        output.pow(2).sum().backward()
        outputs.append(output.detach())
    assert len(calls[0]) == 2 and len(calls[1]) == 4, "each BERT layer should run again during backward"
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-7)
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        if a.grad is None:
            assert b.grad is None
        else:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7)
    checkpointed.set_grad_checkpointing(False)
    calls[1].clear()
    checkpointed(input_ids, attention_mask).sum().backward()
    assert len(calls[1]) == 2


def test_missing_transformers_raises_import_error_with_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ImportError, match='pip install -e ".\\[hf\\]"'):
        HuggingFaceEncoder(tmp_path)


def test_bad_arguments(saved_bert):
    _, reference = saved_bert
    with pytest.raises(ValueError, match="pooling='max'"):
        HuggingFaceEncoder(reference, pooling="max")
    with pytest.raises(TypeError, match="path_or_model"):
        HuggingFaceEncoder(3)
