"""The vision-language embedder (models/vision_language.py) and its collator: tiny Qwen2-VL and Idefics3 from a
config with their processors (tests/vlm_models.py), rows mixing text only, image only, image + text with
placeholders and two images. GradCache over the encoder against one full-batch backward on every parameter;
the collator's text against the processor given the markers by hand; the LoRA targets against the vision tower's
modules."""
from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
pytest.importorskip("PIL", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache import FullBatch, GradCache  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402
from gradcache.models.vision_language import VisionLanguageEncoder, language_model_lora_targets  # noqa: E402
from gradcache.models.vision_language_collator import (  # noqa: E402
    VisionLanguageCollator, VisionLanguageInput,
)
from tests.vlm_models import IDEFICS_IMAGE, QWEN_IMAGE, images, tiny_idefics3, tiny_qwen2_vl  # noqa: E402

BUILDERS = {"qwen": tiny_qwen2_vl, "idefics": tiny_idefics3}
MARKERS = {"qwen": QWEN_IMAGE, "idefics": IDEFICS_IMAGE}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def mixed_inputs(seed: int) -> list[VisionLanguageInput]:
    """Text only, image only, image + text with placeholders (two images), image before text."""
    pictures = images(4, seed)
    return [VisionLanguageInput("a cat on the mat"), VisionLanguageInput(images=(pictures[0],)),
            VisionLanguageInput("<image> the red dog <image>", (pictures[1], pictures[2])),
            VisionLanguageInput("blue tree", (pictures[3],))]


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}


def step(strategy_class, encoder, inputs, chunk_size=None, **options):
    encoder.zero_grad(set_to_none=True)
    loss = strategy_class(encoder, InfoNCE(temperature=0.1), chunk_size, **options).step(*inputs)
    return loss, gradients(encoder)


def assert_close(got: dict, want: dict, rel: float = 1e-5) -> None:
    """Each gradient within `rel` of its own largest entry (or of the model's largest, for one that is zero but
    for rounding)."""
    assert got.keys() == want.keys() and want
    overall = max(w.abs().max().item() for w in want.values())
    assert overall > 0
    for name, w in want.items():
        error, scale = (got[name] - w).abs().max().item(), max(w.abs().max().item(), 1e-4 * overall)
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("family,pooling,train_vision", [("qwen", "last", True), ("qwen", "mean", False),
                                                         ("idefics", "last", True)])
def test_gradcache_over_the_encoder_equals_one_full_batch_backward(family, pooling, train_vision):
    model, processor = BUILDERS[family](seed=0)
    encoder = VisionLanguageEncoder(model, pooling=pooling, train_vision=train_vision)
    collator = VisionLanguageCollator(processor, query_prompt="a photo of ", max_pixels=84 * 84)
    inputs = collator.queries(mixed_inputs(0)), collator.passages(mixed_inputs(1))
    want_loss, want = step(FullBatch, encoder, inputs)
    assert any("visual" in name or "vision_model" in name for name in want) == train_vision
    got_loss, got = step(GradCache, encoder, inputs, 2)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


def test_a_frozen_tower_reused_from_phase_one_gives_the_same_gradients():
    model, processor = tiny_qwen2_vl(seed=1)
    encoder = VisionLanguageEncoder(model)
    assert not any(p.requires_grad for p in encoder.vision_tower.parameters())
    collator = VisionLanguageCollator(processor)
    inputs = collator.queries(mixed_inputs(0)), collator.passages(mixed_inputs(1))
    _, want = step(FullBatch, encoder, inputs)
    calls = []
    encoder.vision_tower.patch_embed.register_forward_pre_hook(lambda *_: calls.append(1))  # the tower computes
    _, got = step(GradCache, encoder, inputs, 2, reuse_outputs=[encoder.vision_tower])
    assert_close(got, want)
    assert len(calls) == 4  # phase (1) alone: each side's 2 chunks hold images


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_the_collators_text_is_the_processors_with_the_markers_in_place(family):
    _, processor = BUILDERS[family](seed=0)
    marker = MARKERS[family]
    inputs = mixed_inputs(0)
    got = VisionLanguageCollator(processor, padding_side="right")(inputs, prompt="the ")
    eos = processor.tokenizer.eos_token
    texts = [f"the a cat on the mat{eos}", f"the {marker}{eos}", f"the {marker} the red dog {marker}{eos}",
             f"the {marker}blue tree{eos}"]
    pictures = [list(item.images) for item in inputs]
    if family == "qwen":
        pictures = [image for row in pictures for image in row]
    want = processor(text=texts, images=pictures, padding=True, padding_side="right", return_tensors="pt")
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_last_token_pooling_is_the_same_whichever_side_pads(family):
    model, processor = BUILDERS[family](seed=0)
    encoder = VisionLanguageEncoder(model).eval()
    inputs = mixed_inputs(0)
    left, right = (encoder(**VisionLanguageCollator(processor, padding_side=side)(inputs))
                   for side in ("left", "right"))
    alone = torch.cat([encoder(**VisionLanguageCollator(processor)([item])) for item in inputs])
    assert torch.allclose(left, alone, atol=1e-5) and torch.allclose(right, alone, atol=1e-5)
    assert torch.allclose(left.norm(dim=1), torch.ones(len(inputs)))


def test_max_pixels_resizes_through_the_processor_keeping_the_aspect():
    _, processor = tiny_qwen2_vl(seed=0)
    wide = images(2)[1]  # 112 x 56
    batch = VisionLanguageCollator(processor, max_pixels=56 * 56)([VisionLanguageInput(images=(wide,))])
    grid = batch["image_grid_thw"]
    t, h, w = grid[0].tolist()
    assert h * w * 14 * 14 <= 56 * 56 and w == 2 * h  # patches of 14 pixels, aspect 2:1 kept
    _, idefics = tiny_idefics3(seed=0)
    tiles = [VisionLanguageCollator(idefics, max_pixels=pixels)([VisionLanguageInput(images=(wide,))])["pixel_values"]
             .shape[1] for pixels in (32 * 32, 64 * 64)]
    assert tiles[0] < tiles[1]


@pytest.mark.parametrize("family,train_vision", [("qwen", True), ("qwen", False), ("idefics", True),
                                                 ("idefics", False)])
def test_always_run_vision_changes_nothing_but_gives_every_parameter_a_gradient(family, train_vision):
    """Text-only chunks with `always_run_vision`: the same embeddings and gradients (bitwise) as without it, and a
    zero gradient on each trainable parameter that text alone never reaches (the tower's; Idefics3's connector,
    trained even with the tower frozen), so that DDP reduces the same parameters on every rank. The stand-in runs
    where the images would, between the token embeddings and the language model, as the call order shows."""
    model, processor = BUILDERS[family](seed=0)
    encoder = VisionLanguageEncoder(model, train_vision=train_vision)
    texts = VisionLanguageCollator(processor).queries([VisionLanguageInput("a cat on the mat"),
                                                       VisionLanguageInput("the red dog")])
    def reached(always_run_vision):
        encoder.always_run_vision = always_run_vision
        encoder.zero_grad(set_to_none=True)
        loss = FullBatch(encoder, InfoNCE(temperature=0.1)).step(texts, texts)
        return loss, {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}

    want_loss, want = reached(False)
    order = []
    for name, module in (("embed_tokens", encoder.language_model.get_input_embeddings()),
                         ("vision", encoder.vision_tower), ("language", encoder.language_model)):
        module.register_forward_pre_hook(lambda *_, name=name: order.append(name))
    got_loss, got = reached(True)
    assert torch.equal(got_loss, want_loss)
    trained = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert got.keys() == trained and want.keys() <= trained
    assert (want.keys() < trained) == (train_vision or family == "idefics")  # Qwen2-VL's merger: in its tower
    for name, gradient in got.items():
        assert torch.equal(gradient, want[name]) if name in want else not gradient.any(), name
    assert order == ["embed_tokens", "vision", "language"] * 2  # the query and passage forwards


def tiny_qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=100, bos_token_id=None, eos_token_id=None,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=56,
                  fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=90, video_token_id=91,
                              vision_start_token_id=92, bos_token_id=None, eos_token_id=None)
    return Qwen2_5_VLModel(config).float()


def tiny_smolvlm():
    from transformers import SmolVLMConfig, SmolVLMModel

    config = SmolVLMConfig(text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                            vocab_size=100),
                           vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=32, patch_size=8),
                           image_token_id=90, scale_factor=2)
    return SmolVLMModel(config).float()


@pytest.mark.parametrize("build", [tiny_qwen2_5_vl, tiny_smolvlm])
def test_the_stand_in_image_reaches_every_parameter_of_the_other_families(build):
    """Qwen2.5-VL (windowed attention) and SmolVLM, the mode's other two families: on text alone the stand-in
    runs the whole trained tower, so every parameter gets a gradient, and the embedding is the one without it."""
    torch.manual_seed(0)
    encoder = VisionLanguageEncoder(build(), train_vision=True)
    tokens = dict(input_ids=torch.randint(0, 80, (2, 5)), attention_mask=torch.ones(2, 5, dtype=torch.long))
    want = encoder(**tokens)
    encoder.always_run_vision = True
    got = encoder(**tokens)
    got.square().sum().backward()
    assert torch.equal(got, want)
    assert [name for name, p in encoder.named_parameters() if p.grad is None] == []


def test_bad_inputs_are_refused_by_name():
    _, processor = tiny_qwen2_vl(seed=0)
    collator = VisionLanguageCollator(processor, max_length=8)
    picture = images(1)[0]
    with pytest.raises(ValueError, match="input 1 has neither text nor an image"):
        collator([VisionLanguageInput("a cat"), VisionLanguageInput()])
    with pytest.raises(ValueError, match="input 0 holds 2 <image> placeholders for 1 images"):
        collator([VisionLanguageInput("<image> a <image>", (picture,))])
    with pytest.raises(ValueError, match=r"input 1 holds \d+ tokens \(4 of them image tokens\), more than max_le"):
        collator([VisionLanguageInput("a"), VisionLanguageInput("a cat on the mat", (picture,))])
    with pytest.raises(ValueError, match="max_pixels must be None .no bound. or an int >= 1, got 0"):
        VisionLanguageCollator(processor, max_pixels=0)
    with pytest.raises(ValueError, match="pooling='cls'"):
        VisionLanguageEncoder(tiny_qwen2_vl(seed=0)[0], pooling="cls")
    with pytest.raises(ValueError, match="always_run_vision has no stand-in image for OtherVLM .model_type 'other'"):
        VisionLanguageEncoder(OtherVLM(), always_run_vision=True)


class OtherVLM(torch.nn.Module):
    """A VLM of a family without a stand-in image (its config has neither a spatial merge nor a scale factor)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(model_type="other", vision_config=types.SimpleNamespace(patch_size=14))
        self.visual, self.language_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def get_image_features(self, pixel_values):
        return self.visual(pixel_values)


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_lora_targets_are_the_language_models_linear_layers_alone(family):
    from peft import LoraConfig, inject_adapter_in_model

    encoder = VisionLanguageEncoder(BUILDERS[family](seed=0)[0])
    targets = language_model_lora_targets(encoder)
    vision = {name for name, _ in encoder.named_modules() if name.startswith(("model.visual", "model.vision_model"))}
    linear = {name for name, m in encoder.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(targets) == linear - vision - {n for n in linear if n.startswith("model.connector")}
    assert language_model_lora_targets(encoder, ("q_proj",)) == [t for t in targets if t.endswith("q_proj")]
    inject_adapter_in_model(LoraConfig(r=2, target_modules=targets), encoder)
    trainable = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name and not name.startswith(tuple(vision)) for name in trainable)
    with pytest.raises(ValueError, match="leaves=\\('qkv',\\)"):
        language_model_lora_targets(encoder, ("qkv",))


@pytest.mark.slow  # save_pretrained imports deepspeed where it is installed: seconds
def test_a_folder_loads_as_the_model_it_was(tmp_path):
    model, _ = tiny_qwen2_vl(seed=3)
    model.save_pretrained(tmp_path)
    loaded = VisionLanguageEncoder(tmp_path).eval()
    built = VisionLanguageEncoder(model).eval()
    _, processor = tiny_qwen2_vl(seed=0)
    batch = VisionLanguageCollator(processor)(mixed_inputs(0))
    assert torch.allclose(loaded(**batch), built(**batch), atol=1e-6)
