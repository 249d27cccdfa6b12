"""`gradcache encode` of a vision-language model (LoadedModel.embed_inputs, built by
gradcache/train/eval/vision_language.py's `vision_language_embedder`): each row of a table one input of its text
(--key), its images (--image-key) or both, in the rows' order, equal to the encoder after the collator computed
here; a row with neither, a bad image and a row too long refused naming the row; --key and --image-key still
exclusive for a model that is not vision-language."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
pytest.importorskip("PIL", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache.models.vision_language import VisionLanguageEncoder  # noqa: E402
from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput  # noqa: E402
from gradcache.train.commands.encode import encode  # noqa: E402
from gradcache.train.errors import DataError, UsageError  # noqa: E402
from gradcache.train.eval.representations import VECTORS  # noqa: E402
from gradcache.train.eval.vision_language import vision_language_embedder  # noqa: E402
from gradcache.train.modes.loaded_model import LoadedModel  # noqa: E402
from tests.vlm_models import images, tiny_qwen2_vl  # noqa: E402

QUERY, PASSAGE = "photo of ", "the "  # words of the tiny vocabulary, a space before the text


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@dataclass(frozen=True)
class VisionLanguageKind:
    """What the commands ask of a model's mode (loaded_model.ModelKind), for a vision-language embedder."""

    kind: str | None = None
    text_embeddings = VECTORS
    ranks_passages: bool = False
    mines: bool = False
    model_noun: str = "vision-language"


@pytest.fixture(scope="module")
def tiny():
    model, processor = tiny_qwen2_vl(seed=2, padding_side="left")
    encoder = VisionLanguageEncoder(model, pooling="last").eval()
    return encoder, processor


def loaded(encoder, processor, batch_size=2, max_length=None):
    collator = VisionLanguageCollator(processor, max_length=max_length, query_prompt=QUERY, passage_prompt=PASSAGE)
    embed = vision_language_embedder(encoder, collator, torch.device("cpu"), batch_size)
    return LoadedModel(mode=VisionLanguageKind(), source="tiny qwen2-vl", module=encoder, device=torch.device("cpu"),
                       embed_inputs=embed), collator


def write_rows(folder, rows):
    pictures = images(4, seed=7)
    (folder / "pictures").mkdir()
    for k, picture in enumerate(pictures):
        picture.save(folder / "pictures" / f"{k}.png")
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, pictures


ROWS = [{"text": "a cat sits on the mat"},  # text only
        {"image": "pictures/0.png"},  # image only
        {"text": "the red dog", "image": "pictures/1.png"},  # image + text
        {"text": "<image> a dog <image> blue tree", "image": ["pictures/2.png", "pictures/3.png"]},  # in place
        {"text": "green", "image": None}]


def reference(encoder, collator, inputs, prompt):
    with torch.no_grad():
        return F.normalize(encoder(**collator(inputs, prompt)), dim=1).numpy()


@pytest.mark.parametrize("tower,prompt", [("query", QUERY), ("passage", PASSAGE)])
def test_rows_of_text_images_or_both_in_order(tmp_path, tiny, tower, prompt):
    encoder, processor = tiny
    data, pictures = write_rows(tmp_path, ROWS)
    model, collator = loaded(encoder, processor)
    got = encode(model, str(data), str(tmp_path / "e.npy"), key="text", image_key="image", tower=tower, batch_size=3)
    inputs = [VisionLanguageInput("a cat sits on the mat"), VisionLanguageInput(images=(pictures[0],)),
              VisionLanguageInput("the red dog", (pictures[1],)),
              VisionLanguageInput("<image> a dog <image> blue tree", (pictures[2], pictures[3])),
              VisionLanguageInput("green")]
    want = reference(encoder, collator, inputs, prompt)  # one batch of all five, left-padded
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), got)


def test_either_key_alone(tmp_path, tiny):
    encoder, processor = tiny
    data, pictures = write_rows(tmp_path, [{"text": "a cat", "image": "pictures/0.png"},
                                           {"text": "blue tree", "image": "pictures/1.png"}])
    model, collator = loaded(encoder, processor)
    texts = encode(model, str(data), str(tmp_path / "t.npy"), key="text")
    np.testing.assert_allclose(texts, reference(encoder, collator, [VisionLanguageInput("a cat"),
                                                                    VisionLanguageInput("blue tree")], PASSAGE),
                               atol=1e-5)
    only_images = encode(model, str(data), str(tmp_path / "i.npy"), image_key="image")
    want = reference(encoder, collator, [VisionLanguageInput(images=(p,)) for p in pictures[:2]], PASSAGE)
    np.testing.assert_allclose(only_images, want, atol=1e-5)


@pytest.mark.parametrize("row,message", [
    ({"text": "", "image": None}, r"line 2 has neither text nor an image"),
    ({"text": "a cat", "image": "../outside.png"}, r"line 2: image path '\.\./outside\.png' leaves the image root"),
    ({"text": "a cat", "image": "notes.png"}, r"line 2: notes\.png does not decode as an image"),
])
def test_a_bad_row_is_refused_by_its_line(tmp_path, tiny, row, message):
    encoder, processor = tiny
    data, _ = write_rows(tmp_path, [{"text": "a dog"}, row])
    (tmp_path / "notes.png").write_text("not a picture")
    with pytest.raises(DataError, match=message):
        encode(loaded(*tiny)[0], str(data), str(tmp_path / "e.npy"), key="text", image_key="image")
    assert not (tmp_path / "e.npy").exists()


def test_a_row_longer_than_the_model_takes_is_refused_by_its_line(tmp_path, tiny):
    data, _ = write_rows(tmp_path, [{"text": "a dog"}, {"text": "blue tree", "image": "pictures/3.png"}])
    model, _ = loaded(*tiny, max_length=8)  # the image alone holds more than 8 tokens
    with pytest.raises(DataError, match=r"line 2: input 0 holds \d+ tokens .* more than max_length=8"):
        encode(model, str(data), str(tmp_path / "e.npy"), key="text", image_key="image", batch_size=4)


def test_a_table_with_neither_key_and_a_model_of_another_kind_are_refused(tmp_path, tiny):
    data, _ = write_rows(tmp_path, [{"text": "a dog"}])
    with pytest.raises(DataError, match="--key, its images' with --image-key, or both"):
        encode(loaded(*tiny)[0], str(data), str(tmp_path / "e.npy"))
    text_model = LoadedModel(mode=VisionLanguageKind(model_noun="text"), source="a text model",
                             module=torch.nn.Identity(), device=torch.device("cpu"), tokenizer=lambda texts: {})
    with pytest.raises(UsageError, match="give one of them"):
        encode(text_model, str(data), str(tmp_path / "e.npy"), key="text", image_key="image")


def test_a_text_file_and_a_folder_of_images(tmp_path, tiny):
    encoder, processor = tiny
    _, pictures = write_rows(tmp_path, [])
    (tmp_path / "texts.txt").write_text("a cat\nthe red dog\n")
    model, collator = loaded(encoder, processor)
    texts = encode(model, str(tmp_path / "texts.txt"), str(tmp_path / "t.npy"), tower="query")
    want = reference(encoder, collator, [VisionLanguageInput("a cat"), VisionLanguageInput("the red dog")], QUERY)
    np.testing.assert_allclose(texts, want, atol=1e-5)
    folder = encode(model, str(tmp_path / "pictures"), str(tmp_path / "i.npy"))  # sorted by path: 0.png .. 3.png
    want = reference(encoder, collator, [VisionLanguageInput(images=(p,)) for p in pictures], PASSAGE)
    np.testing.assert_allclose(folder, want, atol=1e-5)
