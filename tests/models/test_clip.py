import pytest
import torch
from torch import nn

from gradcache.models import CLIP, ByteTokenizer, EncoderTower, TextEncoder, ViTEncoder

TOKENIZER = ByteTokenizer(context_length=16)


def _model(embed_dim=8):
    torch.manual_seed(0)
    return CLIP(
        ViTEncoder(image_size=16, patch_size=8, width=16, layers=1, heads=2),
        TextEncoder(TOKENIZER.vocab_size, context_length=16, width=24, layers=1, heads=2),
        embed_dim=embed_dim,
    )


def test_towers_are_separate_modules_with_disjoint_parameters_covering_the_model():
    model = _model()
    assert isinstance(model.image_tower, EncoderTower) and isinstance(model.text_tower, EncoderTower)
    assert model.image_tower is not model.text_tower
    image_ids = {id(p) for p in model.image_tower.parameters()}
    text_ids = {id(p) for p in model.text_tower.parameters()}
    assert image_ids and text_ids and not image_ids & text_ids
    assert image_ids | text_ids == {id(p) for p in model.parameters()}


def test_each_tower_includes_its_projection_and_outputs_embed_dim():
    model = _model(embed_dim=8)
    images, texts = torch.randn(3, 3, 16, 16), TOKENIZER(["a", "bb", "ccc"])
    image_embeddings = model.image_tower(images)
    text_embeddings = model.text_tower(input_ids=texts["input_ids"], attention_mask=texts["attention_mask"])
    assert image_embeddings.shape == text_embeddings.shape == (3, 8)
    torch.testing.assert_close(image_embeddings, model.image_tower.projection(model.image_tower.encoder(images)))
    torch.testing.assert_close(text_embeddings, model.text_tower.projection(model.text_tower.encoder(**texts)))
    torch.testing.assert_close(model.encode_image(images), image_embeddings)
    torch.testing.assert_close(model.encode_text(**texts), text_embeddings)
    both = model(images, **texts)
    torch.testing.assert_close(both[0], image_embeddings)
    torch.testing.assert_close(both[1], text_embeddings)


def test_has_no_temperature_parameter():
    # The learnable temperature belongs to the loss.
    model = _model()
    assert all(parameter.dim() >= 1 and parameter.numel() > 1 for parameter in model.parameters())


def test_set_grad_checkpointing_reaches_both_encoders():
    model = _model()
    model.set_grad_checkpointing(True)
    assert model.image_tower.encoder.grad_checkpointing and model.text_tower.encoder.grad_checkpointing
    model.set_grad_checkpointing(False)
    assert not model.image_tower.encoder.grad_checkpointing and not model.text_tower.encoder.grad_checkpointing


def test_shared_encoder_raises_value_error():
    text = TextEncoder(TOKENIZER.vocab_size, context_length=16, width=16, layers=1, heads=2)
    with pytest.raises(ValueError, match="share"):
        CLIP(text, text)


def test_encoder_without_out_dim_raises_type_error():
    with pytest.raises(TypeError, match="image_encoder \\(Flatten\\) has no positive int attribute out_dim"):
        CLIP(nn.Flatten(), TextEncoder(TOKENIZER.vocab_size))


def test_bad_embed_dim_raises_value_error():
    with pytest.raises(ValueError, match="embed_dim=0"):
        _model(embed_dim=0)
