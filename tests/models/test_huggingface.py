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


def test_wrapper_mode_governs_the_loaded_model_from_construction(tmp_path):
    from tests.tiny_text_model import write_tiny_bert

    path = write_tiny_bert(tmp_path / "bert", dropout=0.5)
    encoder = HuggingFaceEncoder(path)  # from_pretrained returns eval mode; the wrapper starts in train mode
    assert encoder.training and all(module.training for module in encoder.modules())
    input_ids, attention_mask = _batch()
    first, second = encoder(input_ids, attention_mask), encoder(input_ids, attention_mask)
    assert not torch.allclose(first, second), "dropout should be active in training mode"
    encoder.eval()
    assert not any(module.training for module in encoder.modules())
    torch.testing.assert_close(encoder(input_ids, attention_mask), encoder(input_ids, attention_mask))


@pytest.mark.parametrize("architecture", ["bert", "roberta", "distilbert"])
def test_every_parameter_left_gets_a_gradient(architecture):
    transformers = pytest.importorskip("transformers")
    sizes = dict(vocab_size=40, hidden_size=16, num_attention_heads=2, max_position_embeddings=32)
    if architecture == "distilbert":  # no pooler: nothing to drop
        model = transformers.DistilBertModel(transformers.DistilBertConfig(
            vocab_size=40, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32))
    else:
        config_class = transformers.BertConfig if architecture == "bert" else transformers.RobertaConfig
        model_class = transformers.BertModel if architecture == "bert" else transformers.RobertaModel
        model = model_class(config_class(num_hidden_layers=2, intermediate_size=32, **sizes))
        assert model.pooler is not None
    encoder = HuggingFaceEncoder(model, pooling="cls")
    assert getattr(encoder.model, "pooler", None) is None
    input_ids, attention_mask = _batch()
    encoder(input_ids, attention_mask).pow(2).sum().backward()
    missing = [name for name, parameter in encoder.named_parameters() if parameter.grad is None]
    assert not missing, f"parameters without a gradient: {missing}"


def test_bad_paths_are_named(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        HuggingFaceEncoder(tmp_path / "missing")
    with pytest.raises(ValueError, match="no config.json"):
        HuggingFaceEncoder(tmp_path)
