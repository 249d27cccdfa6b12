import json

import pytest
import torch
import torch.nn.functional as F

from gradcache.models import HuggingFaceEncoder
from gradcache.models import HuggingFaceTokenizer
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
from tests.tiny_text_model import write_tiny_bert

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

TEXTS = ["a red fox", "the quick brown dog jumps", "hi"]


def _reference_hidden(path, tokens):
    import transformers

    model = transformers.BertModel.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        return model(**tokens).last_hidden_state  # (B, L, H)


@pytest.mark.parametrize("pooling_config, normalize", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, True),  # the older boolean keys
    ({"pooling_mode": "mean"}, False),  # sentence-transformers >= 5
    ({"pooling_mode": "mean"}, True),
])
def test_folder_pooling_and_normalisation_against_manual_computation(tmp_path, pooling_config, normalize):
    path = write_tiny_bert(tmp_path / "st", sentence_transformers={**pooling_config, "normalize": normalize})
    layout = read_sentence_transformer_folder(path)
    cls = pooling_config.get("pooling_mode_cls_token", False)
    assert (layout.pooling, layout.normalize, layout.max_seq_length) == ("cls" if cls else "mean", normalize, 64)
    encoder = HuggingFaceEncoder(path).eval()
    assert (encoder.pooling, encoder.normalize, encoder.max_seq_length) == (layout.pooling, normalize, 64)
    tokens = HuggingFaceTokenizer(path, max_length=16)(TEXTS)
    hidden = _reference_hidden(path, tokens)
    expected = []
    for row in range(len(TEXTS)):
        kept = hidden[row, tokens["attention_mask"][row].bool()]
        vector = hidden[row, 0] if cls else kept.mean(dim=0)
        expected.append(vector / vector.norm() if normalize else vector)
    torch.testing.assert_close(encoder(**tokens), torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_equals_sentence_transformers_encode(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    path = write_tiny_bert(tmp_path / "st", sentence_transformers={"pooling_mode": "mean", "normalize": True})
    reference = sentence_transformers.SentenceTransformer(str(path), device="cpu")
    expected = torch.as_tensor(reference.encode(TEXTS, convert_to_numpy=True))
    encoder = HuggingFaceEncoder(path).eval()
    with torch.no_grad():
        pooled = encoder(**HuggingFaceTokenizer(path, max_length=64)(TEXTS))
    torch.testing.assert_close(pooled, expected, rtol=1e-4, atol=1e-5)


def test_explicit_arguments_override_the_folder(tmp_path):
    path = write_tiny_bert(tmp_path / "st", sentence_transformers={"pooling_mode": "mean", "normalize": True})
    encoder = HuggingFaceEncoder(path, pooling="cls", normalize=False).eval()
    tokens = HuggingFaceTokenizer(path)(TEXTS)
    torch.testing.assert_close(encoder(**tokens), _reference_hidden(path, tokens)[:, 0], rtol=1e-5, atol=1e-6)


def test_plain_folder_has_no_layout_and_pools_by_mean(tmp_path):
    path = write_tiny_bert(tmp_path / "plain")
    assert read_sentence_transformer_folder(path) is None
    encoder = HuggingFaceEncoder(path)
    assert (encoder.pooling, encoder.normalize, encoder.max_seq_length) == ("mean", False, None)


def test_transformer_in_a_sub_folder(tmp_path):
    root = tmp_path / "st"
    write_tiny_bert(root / "0_Transformer")
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}]))
    assert read_sentence_transformer_folder(root).model_path == root / "0_Transformer"
    encoder = HuggingFaceEncoder(root).eval()
    tokens = HuggingFaceTokenizer(root)(TEXTS)
    hidden = _reference_hidden(root / "0_Transformer", tokens)
    assert encoder(**tokens).shape == (3, 16) and hidden.shape[0] == 3


@pytest.mark.parametrize("change, message", [
    ({"pooling": {"pooling_mode": "max"}}, "pools by 'max'"),
    ({"pooling": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}}, "pools by 'cls\\+mean'"),
    ({"module": "sentence_transformers.models.Dense"}, "'Dense' module"),
    ({"modules_text": "{not json"}, "cannot read"),
])
def test_folders_that_cannot_be_applied_are_refused(tmp_path, change, message):
    path = write_tiny_bert(tmp_path / "st", sentence_transformers={"pooling_mode": "mean"})
    if "pooling" in change:
        (path / "1_Pooling" / "config.json").write_text(json.dumps(change["pooling"]))
    if "module" in change:
        modules = json.loads((path / "modules.json").read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": change["module"]})
        (path / "modules.json").write_text(json.dumps(modules))
    if "modules_text" in change:
        (path / "modules.json").write_text(change["modules_text"])
    with pytest.raises(ValueError, match=message):
        HuggingFaceEncoder(path)
    if "pooling" in change:  # an explicit pooling overrides the folder's
        assert HuggingFaceEncoder(path, pooling="cls").pooling == "cls"


def test_tokenizer_pads_to_the_longest_and_truncates(tmp_path):
    path = write_tiny_bert(tmp_path / "plain")
    batch = HuggingFaceTokenizer(path, max_length=8)(TEXTS)
    assert set(batch) == {"input_ids", "attention_mask"}
    assert batch["input_ids"].shape == (3, 8) and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"][2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]  # [CLS] h ##i [SEP]
    short = HuggingFaceTokenizer(path, max_length=64)(["hi", "a"])
    assert short["input_ids"].shape == (2, 4)


def test_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        HuggingFaceTokenizer(tmp_path / "missing")
    path = write_tiny_bert(tmp_path / "plain")
    (path / "vocab.txt").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="holds no tokenizer"):
        HuggingFaceTokenizer(path)
    with pytest.raises(ValueError, match="max_length=1"):
        HuggingFaceTokenizer(path, max_length=1)
    with pytest.raises(TypeError, match="wrap a single text"):
        HuggingFaceTokenizer(write_tiny_bert(tmp_path / "other"))("one text")


@pytest.mark.parametrize("module_path", ["../../..", "../outside", "/abs/elsewhere", "0_Transformer/../../x"])
def test_a_module_path_that_leaves_the_folder_is_refused_naming_it(tmp_path, module_path):
    """modules.json names a module by a path inside the folder; one that leaves it would load another model."""
    root = write_tiny_bert(tmp_path / "a" / "b" / "st", sentence_transformers={"pooling_mode": "mean"})
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = module_path
    (root / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError) as caught:
        read_sentence_transformer_folder(root)
    message = str(caught.value)
    assert repr(module_path) in message and "modules.json" in message and "outside" in message


def test_the_program_refuses_such_a_folder_with_status_2_naming_option_and_path(tmp_path, capsys):
    from gradcache.cli import main
    from tests.train.conftest import text_args

    root = write_tiny_bert(tmp_path / "st", sentence_transformers={"pooling_mode": "mean"})
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = "../../.."
    (root / "modules.json").write_text(json.dumps(modules))
    assert main(text_args(root, tmp_path / "run", "--steps", "1")) == 2
    err = capsys.readouterr().err
    assert f"--model {root}" in err and "'../../..'" in err and "outside the folder" in err
    assert not (tmp_path / "run").exists()
