"""A vision-language embedder written as a sentence-transformers folder (gradcache/train/export/vision_language.py)
and read back (models/vision_language_folder.py), on a tiny Qwen2-VL and a tiny Idefics3 built from a config
(tests/vlm_models.py): `SentenceTransformer(folder)` tokenises a text, an image and an image + text exactly as
`VisionLanguageCollator` does (the same input_ids and attention mask, prompts included), and embeds them as
`VisionLanguageEncoder` does (cosine >= 0.9999); the folder read back embeds as the model written (1e-6); a LoRA
model is written merged, its adapter loading on the base folder."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
pytest.importorskip("PIL", reason='the dev extra installs it: pip install -e ".[dev]"')
sentence_transformers = pytest.importorskip("sentence_transformers")

from gradcache.models.vision_language import VisionLanguageEncoder, language_model_lora_targets  # noqa: E402
from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput  # noqa: E402
from gradcache.models.vision_language_folder import (  # noqa: E402
    is_vision_language_folder, read_vision_language_folder,
)
from gradcache.train.export.vision_language import write_vision_language_folder  # noqa: E402
from tests.vlm_models import images, tiny_idefics3, tiny_qwen2_vl  # noqa: E402

# (builder, pooling, max_pixels): Qwen2-VL's budget in pixels below its processor's 84 x 112, Idefics3's longest
# side 48 below its 64 (both resize the test's images)
FAMILIES = {"qwen2-vl": (tiny_qwen2_vl, "last", 56 * 84), "idefics3": (tiny_idefics3, "mean", 48 * 48)}
PROMPTS = {"query": "photo of ", "document": "the "}  # words of the tiny vocabulary: they change the tokens


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def base_folder(family: str, folder):
    """The tiny model and its processor saved as a Hugging Face VLM folder (save_pretrained)."""
    model, processor = FAMILIES[family][0](seed=1, padding_side="left")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, processor


def inputs_and_st_inputs():
    """A text, an image, an image + text, two images in place of placeholders: ours and sentence-transformers'."""
    pictures = images(4, seed=5)
    ours = [VisionLanguageInput("a cat sits on the mat"), VisionLanguageInput(images=(pictures[0],)),
            VisionLanguageInput("the red dog", (pictures[1],)),
            VisionLanguageInput("<image> a dog <image> blue tree", (pictures[2], pictures[3]))]
    theirs = ["a cat sits on the mat", pictures[0], {"image": pictures[1], "text": "the red dog"},
              {"image": [pictures[2], pictures[3]], "text": "<image> a dog <image> blue tree"}]
    return ours, theirs


def embed(encoder, collator, inputs, prompt=""):
    with torch.no_grad():
        return encoder(**collator(inputs, prompt))


def assert_cosine(got, want, least=0.9999):
    cosine = F.cosine_similarity(torch.as_tensor(got, dtype=torch.float64), want.double(), dim=1)
    assert cosine.min().item() >= least, cosine.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_transformers_encodes_text_image_and_pairs_as_the_encoder_and_collator(tmp_path, family):
    from sentence_transformers import SentenceTransformer

    base, processor = base_folder(family, tmp_path / "base")
    _, pooling, max_pixels = FAMILIES[family]
    encoder = VisionLanguageEncoder(base, pooling=pooling).eval()
    collator = VisionLanguageCollator(processor, max_pixels=max_pixels, max_length=200, padding_side="left")
    written = tmp_path / "model"
    write_vision_language_folder(encoder, processor, written, base=str(base), max_length=200, max_pixels=max_pixels,
                                 query_prompt=PROMPTS["query"], passage_prompt=PROMPTS["document"])
    model = SentenceTransformer(str(written), device="cpu")
    ours, theirs = inputs_and_st_inputs()
    for prompt in ("", PROMPTS["query"], PROMPTS["document"]):
        # the tokens themselves: sentence-transformers' chat template renders each input as the collator's text
        features = model[0].preprocess(theirs, prompt=prompt or None)
        batch = collator(ours, prompt)
        assert features["input_ids"].tolist() == batch["input_ids"].tolist(), prompt
        assert features["attention_mask"].tolist() == batch["attention_mask"].tolist()
        torch.testing.assert_close(features["pixel_values"], batch["pixel_values"])
    want = embed(encoder, collator, ours)
    assert_cosine(model.encode(theirs, convert_to_tensor=True), want)
    for name, prompt in PROMPTS.items():
        assert_cosine(model.encode(theirs, prompt_name=name, convert_to_tensor=True),
                      embed(encoder, collator, ours, prompt))
    assert_cosine(model.encode_query(theirs, convert_to_tensor=True), embed(encoder, collator, ours, PROMPTS["query"]))
    # one at a time too: no padding, and each input's own batch
    for one, theirs_one in zip(ours, theirs):
        assert_cosine(model.encode([theirs_one], convert_to_tensor=True), embed(encoder, collator, [one]))

    read = read_vision_language_folder(written)
    assert (read.pooling, read.max_length, read.max_pixels) == (pooling, 200, None)
    assert (read.query_prompt, read.passage_prompt) == (PROMPTS["query"], PROMPTS["document"])
    again = VisionLanguageCollator(read.processor, max_pixels=read.max_pixels, max_length=read.max_length,
                                   query_prompt=read.query_prompt, passage_prompt=read.passage_prompt)
    with torch.no_grad():
        torch.testing.assert_close(read.encoder(**again.queries(ours)), encoder(**collator(ours, PROMPTS["query"])),
                                   atol=1e-6, rtol=0)
    assert not read.encoder.training


def test_a_hugging_face_folder_reads_with_last_token_pooling_and_no_prompts(tmp_path):
    base, processor = base_folder("qwen2-vl", tmp_path / "base")
    assert is_vision_language_folder(base)
    read = read_vision_language_folder(base)
    assert (read.pooling, read.max_length, read.max_pixels, read.query_prompt, read.passage_prompt) == \
        ("last", None, None, None, None)
    ours, _ = inputs_and_st_inputs()
    want = embed(VisionLanguageEncoder(base, pooling="last").eval(), VisionLanguageCollator(processor), ours)
    torch.testing.assert_close(embed(read.encoder, VisionLanguageCollator(read.processor), ours), want, atol=1e-6,
                               rtol=0)


def test_only_vision_language_folders_are_recognised(tmp_path, tiny_bert):
    assert not is_vision_language_folder(tiny_bert)  # a BERT's config.json: no vision config
    assert not is_vision_language_folder(tmp_path)  # nothing at all
    (tmp_path / "config.json").write_text('{"model_type": "clip", "vision_config": {}, "text_config": {}}')
    assert not is_vision_language_folder(tmp_path)  # two towers, no image token in a language model
    with pytest.raises(ValueError, match="holds no vision-language model"):
        read_vision_language_folder(tmp_path)


def test_a_lora_model_is_written_merged_and_its_adapter_loads_on_the_base(tmp_path):
    peft = pytest.importorskip("peft")
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    base, processor = base_folder("qwen2-vl", tmp_path / "base")
    encoder = VisionLanguageEncoder(base, pooling="last").eval()
    targets = language_model_lora_targets(encoder.model)
    encoder.model = peft.get_peft_model(encoder.model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in encoder.model.named_parameters():
            if "lora_B" in name:  # zero at creation: the adapter would change nothing
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    collator = VisionLanguageCollator(processor)
    ours, theirs = inputs_and_st_inputs()
    adapted = embed(encoder, collator, ours)
    plain = embed(VisionLanguageEncoder(base, pooling="last").eval(), collator, ours)
    assert F.cosine_similarity(adapted, plain).min() < 0.99  # the adapter matters

    written = tmp_path / "model"
    write_vision_language_folder(encoder, processor, written, base=str(base), max_length=None, max_pixels=None,
                                 query_prompt=None, passage_prompt=None)
    assert isinstance(encoder.model, peft.PeftModel)  # the encoder keeps its adapter
    torch.testing.assert_close(embed(encoder, collator, ours), adapted)
    assert_cosine(SentenceTransformer(str(written), device="cpu").encode(theirs, convert_to_tensor=True), adapted)
    read = read_vision_language_folder(written)
    torch.testing.assert_close(embed(read.encoder, collator, ours), adapted, atol=1e-5, rtol=0)
    on_base = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(str(base), local_files_only=True),
                                             str(written / "adapter"))
    torch.testing.assert_close(embed(VisionLanguageEncoder(on_base, pooling="last").eval(), collator, ours), adapted,
                               atol=1e-5, rtol=0)
    card = (written / "README.md").read_text()
    assert str(base) in card and "PeftModel.from_pretrained" in card


def test_sentence_transformers_refuses_what_the_collator_refuses(tmp_path):
    """Placeholders that do not match the images: the chat template raises, as the collator does."""
    import jinja2
    from sentence_transformers import SentenceTransformer

    base, processor = base_folder("qwen2-vl", tmp_path / "base")
    write_vision_language_folder(VisionLanguageEncoder(base).eval(), processor, tmp_path / "model", base=str(base),
                                 max_length=None, max_pixels=None, query_prompt=None, passage_prompt=None)
    model = SentenceTransformer(str(tmp_path / "model"), device="cpu")
    picture = images(1)[0]
    with pytest.raises(ValueError, match="placeholders"):
        VisionLanguageCollator(processor)([VisionLanguageInput("<image> <image> a cat", (picture,))])
    with pytest.raises(jinja2.TemplateError, match="2 <image> placeholders for 1 images"):
        model.encode([{"image": picture, "text": "<image> <image> a cat"}])
