"""A text run's RUN/model loads in sentence-transformers and in transformers and embeds as the program does."""
import json

import pytest
import torch
import torch.nn.functional as F

from gradcache.cli import main
from gradcache.models import HuggingFaceTokenizer
from gradcache.train.model_folders import ModelFolderFormat, model_folder_format
from tests.tiny_text_model import write_tiny_bert
from tests.train.conftest import text_args
from tests.train.export.helpers import program_model

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
TEXTS = ["which baker in quillby keeps bees?", "orvel daskin is a dentist in quillby.", "a pilot", "x" * 80]
MAX_LENGTH = 24  # TINY's --max-length, below the base folder's own 64


@pytest.fixture(scope="module")
def st_bert(tmp_path_factory):
    """A sentence-transformers base folder that pools by CLS and normalises (the other path of the writer)."""
    return write_tiny_bert(tmp_path_factory.mktemp("models") / "st", seed=1,
                           sentence_transformers={"pooling_mode_cls_token": True, "normalize": True})


def _sentence_transformer(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu", local_files_only=True)


def _program(config, encode):
    tokens = HuggingFaceTokenizer(config.model, config.max_length)(TEXTS)
    with torch.no_grad():
        return encode(**tokens)


@pytest.mark.slow
@pytest.mark.parametrize("base", ["plain", "sentence-transformers"])
def test_shared_tower_loads_in_sentence_transformers_and_transformers(tmp_path, tiny_bert, st_bert, base):
    model_folder = tiny_bert if base == "plain" else st_bert
    assert main(text_args(model_folder, tmp_path / "run")) == 0
    exported = tmp_path / "run" / "model"
    assert model_folder_format(exported) is ModelFolderFormat.SENTENCE_TRANSFORMERS
    config, model, _ = program_model(tmp_path / "run")
    want = _program(config, model.encode_query)

    loaded = _sentence_transformer(exported)
    assert loaded.max_seq_length == MAX_LENGTH
    got = loaded.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS))
    torch.testing.assert_close(got, want)
    if base == "sentence-transformers":  # normalised as trained
        torch.testing.assert_close(got.norm(dim=1), torch.ones(len(TEXTS)))

    auto, info = transformers.AutoModel.from_pretrained(str(exported), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # the pooler is written back too
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    with torch.no_grad():
        hidden = auto.eval()(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = hidden[:, 0] if base != "plain" else (hidden * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(F.normalize(pooled, dim=-1) if base != "plain" else pooled, want)


@pytest.mark.slow
def test_separate_towers_are_two_folders_each_its_own_side(tmp_path, tiny_bert):
    assert main(text_args(tiny_bert, tmp_path / "run", "--separate-towers")) == 0
    exported = tmp_path / "run" / "model"
    assert model_folder_format(exported) is ModelFolderFormat.SENTENCE_TRANSFORMERS_TOWERS
    assert "query" in (exported / "README.md").read_text()
    config, model, _ = program_model(tmp_path / "run")
    queries = _sentence_transformer(exported / "query").encode(TEXTS, convert_to_tensor=True)
    passages = _sentence_transformer(exported / "passage").encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(queries, _program(config, model.encode_query))
    torch.testing.assert_close(passages, _program(config, model.encode_passage))
    assert (queries - passages).abs().max() > 1e-4  # two towers trained apart, not one written twice
    assert json.loads((exported / "query" / "sentence_bert_config.json").read_text())["max_seq_length"] == MAX_LENGTH
