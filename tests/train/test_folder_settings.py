"""Every setting of a sentence-transformers module config that changes the embedding is honoured or refused (issue
40 item 3): `gradcache encode` on a SparseEncoder folder equals `SparseEncoder.encode_document` for each
SpladePooling `pooling_strategy` and `activation_function`, and `do_lower_case` in `sentence_bert_config.json`
with a cased tokenizer equals sentence-transformers for the dense, sparse and multi-vector kinds; a value
sentence-transformers refuses, or a key this program does not apply, exits 2 naming the file and the key; an
unknown key is a warning naming it. The folders are written here by sentence-transformers from a tiny cased BERT:
no download."""
from __future__ import annotations

import json
import string
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from tests.tiny_text_model import SPECIAL

pytest.importorskip("sentence_transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

TEXTS = ["Who Bakes BREAD in Town?", "ANN bakes bread.", "bob Fixes TEETH", "Eve keeps BEES!"]
CHARACTERS = list(string.ascii_letters + string.digits + string.punctuation)

# case -> (the config file, what is written into it, expected status, message fragment)
CASES = {
    "splade max relu": ("1_SpladePooling/config.json", {"pooling_strategy": "max"}, errors.OK, ""),
    "splade sum relu": ("1_SpladePooling/config.json", {"pooling_strategy": "sum"}, errors.OK, ""),
    "splade max log1p_relu": ("1_SpladePooling/config.json", {"activation_function": "log1p_relu"}, errors.OK, ""),
    "splade sum log1p_relu": ("1_SpladePooling/config.json",
                              {"pooling_strategy": "sum", "activation_function": "log1p_relu"}, errors.OK, ""),
    "splade mean": ("1_SpladePooling/config.json", {"pooling_strategy": "mean"}, errors.USAGE,
                    "1_SpladePooling/config.json: pooling_strategy 'mean' is not one of 'max', 'sum'"),
    "splade softplus": ("1_SpladePooling/config.json", {"activation_function": "softplus"}, errors.USAGE,
                        "activation_function 'softplus' is not one of 'relu', 'log1p_relu'"),
    "sparse do_lower_case": ("sentence_bert_config.json", {"do_lower_case": True}, errors.OK, ""),
    "dense do_lower_case": ("sentence_bert_config.json", {"do_lower_case": True}, errors.OK, ""),
    "multi-vector do_lower_case": ("sentence_bert_config.json", {"do_lower_case": True}, errors.OK, ""),
    "dense do_lower_case not a bool": ("sentence_bert_config.json", {"do_lower_case": "yes"}, errors.USAGE,
                                       "sentence_bert_config.json: do_lower_case 'yes' must be true or false"),
    "dense query_expansion": ("sentence_bert_config.json",
                              {"query_expansion": {"strategy": "fixed", "length": 8}}, errors.USAGE,
                              "sentence_bert_config.json: query_expansion"),
    "dense tokenizer_args": ("sentence_bert_config.json", {"tokenizer_args": {"model_max_length": 4}},
                             errors.USAGE, "sentence_bert_config.json: tokenizer_args"),
    "dense unknown pooling key": ("1_Pooling/config.json", {"pooling_flavour": "vanilla"}, errors.OK,
                                  "'pooling_flavour' unknown to this program"),
}


def _write_cased_bert(folder: Path, masked_lm: bool) -> Path:
    """A 2-layer BERT with a cased character vocabulary ("A" and "a" are two tokens) and its cased tokenizer."""
    import transformers

    folder.mkdir(parents=True)
    vocab = SPECIAL + CHARACTERS + [f"##{c}" for c in CHARACTERS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=False).save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    (transformers.BertForMaskedLM if masked_lm else transformers.BertModel)(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def peer_folders(tmp_path_factory):
    """kind -> a folder that sentence-transformers saved for it from the cased BERT."""
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder
    from sentence_transformers.models import Pooling, Transformer
    from sentence_transformers.sparse_encoder.models import SpladePooling

    root = tmp_path_factory.mktemp("folders")
    bert, mlm = _write_cased_bert(root / "bert", False), _write_cased_bert(root / "mlm", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformer = Transformer(str(bert))
        SentenceTransformer(modules=[transformer, Pooling(16, "mean")], device="cpu").save(str(root / "dense"))
        SparseEncoder(modules=[Transformer(str(mlm), transformer_task="fill-mask"), SpladePooling("max")],
                      device="cpu").save(str(root / "sparse"))
        MultiVectorEncoder(str(bert), device="cpu", local_files_only=True).save(str(root / "multi-vector"))
    return root


def _edited_copy(peer_folders: Path, kind: str, file: str, changes: dict, tmp_path: Path) -> Path:
    import shutil

    folder = shutil.copytree(peer_folders / kind, tmp_path / kind)
    path = folder / file
    values = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps({**values, **changes}), encoding="utf-8")
    return folder


def _peer_rows(kind: str, folder: Path) -> list[np.ndarray]:
    """What sentence-transformers gives for TEXTS as documents: one row (dense: normalised) or token matrix each."""
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "sparse":
            return list(SparseEncoder(str(folder), device="cpu").encode_document(TEXTS).to_dense().numpy())
        if kind == "dense":
            return list(SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True))
        return [tokens.numpy() for tokens in MultiVectorEncoder(str(folder), device="cpu").encode_document(TEXTS)]


def _our_rows(kind: str, output: Path) -> list[np.ndarray]:
    written = np.load(output)
    if kind == "dense":
        return list(written)
    if kind == "multi-vector":
        offsets = written["offsets"]
        return [written["values"][start:stop] for start, stop in zip(offsets[:-1], offsets[1:])]
    dense = np.zeros(tuple(written["shape"]), dtype=np.float32)
    for row in range(dense.shape[0]):
        start, stop = written["indptr"][row], written["indptr"][row + 1]
        dense[row, written["indices"][start:stop]] = written["data"][start:stop]
    return list(dense)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_module_setting_is_honoured_or_refused(peer_folders, tmp_path, capsys, case):
    file, changes, status, fragment = CASES[case]
    kind = next((name for name in ("multi-vector", "dense", "sparse") if case.startswith(name)), "sparse")
    folder = _edited_copy(peer_folders, kind, file, changes, tmp_path)
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    output = tmp_path / ("out.npy" if kind == "dense" else "out.npz")
    # a warning reaches a user on stderr; pytest records it instead, so the test reads both
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["encode", str(folder), "--data", str(data), "--output", str(output)]) == status, \
            capsys.readouterr().err
    err = capsys.readouterr().err
    assert fragment in err + "".join(str(warning.message) for warning in caught), err
    if status != errors.OK:
        assert str(folder / file) in err and "Traceback" not in err and not output.exists(), err
        return
    # sentence-transformers refuses a key it does not know (TypeError): the peer reads the folder without it
    ours, theirs = _our_rows(kind, output), _peer_rows(kind, peer_folders / kind if "unknown" in case else folder)
    assert len(ours) == len(theirs)
    for mine, peer in zip(ours, theirs):
        assert mine.shape == peer.shape
        np.testing.assert_allclose(mine, peer, rtol=1e-5, atol=1e-5)
    if changes.get("do_lower_case"):  # the control: the folder without it encodes otherwise
        plain = _edited_copy(peer_folders, kind, file, {"do_lower_case": False}, tmp_path / "plain")
        assert main(["encode", str(plain), "--data", str(data), "--output", str(tmp_path / output.name)]) == 0
        assert any(mine.shape != other.shape or not np.allclose(mine, other, atol=1e-3)
                   for mine, other in zip(ours, _our_rows(kind, tmp_path / output.name)))


def test_the_layout_reads_each_setting(tmp_path):
    """Without sentence-transformers or a model: each key read, refused or warned of by the folder's reader."""
    from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

    folder = tmp_path / "sparse"
    (folder / "1_SpladePooling").mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}]))
    pooling = folder / "1_SpladePooling" / "config.json"
    settings = folder / "sentence_bert_config.json"
    pooling.write_text(json.dumps({"pooling_strategy": "sum", "activation_function": "log1p_relu",
                                   "embedding_dimension": None}))
    settings.write_text(json.dumps({"max_seq_length": 32, "do_lower_case": True, "unpad_inputs": False}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for keys it knows
        layout = read_sentence_transformer_folder(folder)
    assert (layout.splade_pooling, layout.splade_activation, layout.do_lower_case, layout.max_seq_length) == \
        ("sum", "log1p_relu", True, 32)
    pooling.write_text(json.dumps({"pooling_strategy": "max", "temperature": 2}))
    with pytest.warns(UserWarning, match="config.json: key\\(s\\) 'temperature' unknown to this program"):
        assert read_sentence_transformer_folder(folder).splade_pooling == "max"
    pooling.write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(ValueError, match="pooling_strategy 'mean' is not one of 'max', 'sum'"):
        read_sentence_transformer_folder(folder)
    pooling.write_text("{}")
    settings.write_text(json.dumps({"document_length": 64}))
    with pytest.raises(ValueError, match="sentence_bert_config.json: document_length 64 sets per-task lengths"):
        read_sentence_transformer_folder(folder)


@pytest.mark.parametrize("strategy", ["max", "sum"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_splade_rows_equal_splade_pooling(strategy, activation):
    from sentence_transformers.sparse_encoder.models import SpladePooling

    from gradcache.models.splade import splade_rows

    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer = SpladePooling(strategy, activation).eval()
    expected = peer({"token_embeddings": logits.clone(), "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(splade_rows(logits, mask, strategy, activation), expected, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_an_export_keeps_the_settings_the_run_followed(peer_folders, tmp_path):
    """A run from a folder with `do_lower_case` and a sum/log1p_relu SpladePooling trains with both; its export
    says so, so sentence-transformers encodes the export as the run does: the same rows as the source folder."""
    from sentence_transformers import SparseEncoder

    from gradcache.models.splade import SpladeEncoder
    from gradcache.train.export.sparse_encoder import write_sparse_encoder_folder

    source = _edited_copy(peer_folders, "sparse", "1_SpladePooling/config.json",
                          {"pooling_strategy": "sum", "activation_function": "log1p_relu"}, tmp_path)
    settings = source / "sentence_bert_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "do_lower_case": True}))
    tower = SpladeEncoder(source)
    write_sparse_encoder_folder(tower, source, 64, tmp_path / "export")
    pooling = json.loads((tmp_path / "export" / "1_SpladePooling" / "config.json").read_text())
    assert (pooling["pooling_strategy"], pooling["activation_function"]) == ("sum", "log1p_relu")
    assert json.loads((tmp_path / "export" / "sentence_bert_config.json").read_text())["do_lower_case"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = SparseEncoder(str(tmp_path / "export"), device="cpu").encode_document(TEXTS).to_dense()
        original = SparseEncoder(str(source), device="cpu").encode_document(TEXTS).to_dense()
    torch.testing.assert_close(exported, original, rtol=1e-5, atol=1e-5)
