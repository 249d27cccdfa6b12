"""The named vision-language presets (models/vision_language_presets.py): built from a config, no download, a
word-level tokenizer over the words given, the same weights from the same seed, the caller's random stream
untouched; the tiny one embeds text, image and image + text rows through the encoder and its collator."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
pytest.importorskip("PIL", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache.models.vision_language import VisionLanguageEncoder  # noqa: E402
from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput  # noqa: E402
from gradcache.models.vision_language_presets import (  # noqa: E402
    VISION_LANGUAGE_PRESETS, build_vision_language_model,
)
from tests.vlm_models import images  # noqa: E402

WORDS = ["a red star", "a blue circle at the top"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_tiny_preset_reads_its_words_and_embeds_each_kind_of_row():
    state = torch.random.get_rng_state()
    model, processor = build_vision_language_model("tiny-qwen2-vl", WORDS, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    preset = VISION_LANGUAGE_PRESETS["tiny-qwen2-vl"]
    tokens = processor.tokenizer("a blue star at the top")["input_ids"]
    assert processor.tokenizer.unk_token_id not in tokens
    assert processor.tokenizer("a green star")["input_ids"][1] == processor.tokenizer.unk_token_id
    encoder = VisionLanguageEncoder(model).eval()
    picture = images(1)[0]  # 56 x 56: 7 x 7 patches of 8 pixels at most 64 x 64 pixels
    rows = [VisionLanguageInput("a red star"), VisionLanguageInput(images=(picture,)),
            VisionLanguageInput("a blue circle", (picture,))]
    batch = VisionLanguageCollator(processor)(rows)
    assert batch["image_grid_thw"].prod(dim=1).mul(preset.patch_size ** 2).le(preset.max_pixels).all()
    embeddings = encoder(**batch)
    assert embeddings.shape == (3, preset.hidden_size) and torch.isfinite(embeddings).all()
    again, _ = build_vision_language_model("tiny-qwen2-vl", WORDS, seed=0)
    other, _ = build_vision_language_model("tiny-qwen2-vl", WORDS, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))


def test_an_unknown_preset_and_no_words_are_refused():
    with pytest.raises(ValueError, match="preset='huge' is not a vision-language preset; choose one of"):
        build_vision_language_model("huge", WORDS)
    with pytest.raises(ValueError, match="words is empty"):
        build_vision_language_model("tiny-qwen2-vl", [])
