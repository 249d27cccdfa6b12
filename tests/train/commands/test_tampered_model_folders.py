"""A model folder whose config.json was edited to huge sizes, whose safetensors header is corrupt, or whose
pytorch_model.bin holds more than tensors is refused before anything of the config's size is built: exit 2, one
line naming the file and the cause (`gradcache encode`, `eval`, `mine` and `train text --model` share the loading)."""
import json
import os
import pickle
import shutil

import pytest
import torch
from safetensors.torch import save_file

from gradcache.cli import main
from gradcache.models.pretrained import PretrainedConfig
from gradcache.train import errors


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo ran > ran-code.txt",))


def _built_in(folder):
    config = PretrainedConfig(gradcache_architecture="simclr", image_encoder="convnet",
                              image_encoder_options={"width": 8, "norm": "group"}, image_size=16, embed_dim=16,
                              hidden_dim=32)
    folder.mkdir()
    save_file(config.build().state_dict(), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    return folder


def _edit_json(path, change):
    values = json.loads(path.read_text())
    change(values)
    path.write_text(json.dumps(values))


def _corrupt_header(path):
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"{not json" + data[17:])


def _huge_built_in(values):
    values["image_encoder_options"]["width"] = 1_000_000  # a 72 TB first convolution


def _huge_bert(values):
    values.update(hidden_size=2_000_000, intermediate_size=8_000_000)


def _tampered(kind, tmp_path, tiny_bert):
    """The folder of `kind` and the file its message must name."""
    if kind.startswith("built-in"):
        folder = _built_in(tmp_path / "model")
    else:
        folder = tmp_path / "bert"
        shutil.copytree(tiny_bert, folder)
    weights = folder / "model.safetensors"
    if kind.startswith("hugging face sharded"):  # as save_pretrained(max_shard_size=...) writes it: two shards
        return _sharded(kind, folder, weights)
    if kind == "built-in huge config":
        _edit_json(folder / "config.json", _huge_built_in)
    elif kind == "hugging face huge config":
        _edit_json(folder / "config.json", _huge_bert)
    elif kind.endswith("corrupt header"):
        _corrupt_header(weights)
    else:  # a pytorch_model.bin that would run code when unpickled
        weights.unlink()
        with open(folder / "pytorch_model.bin", "wb") as handle:
            pickle.dump({"embeddings.word_embeddings.weight": _RunsCode()}, handle, protocol=2)  # as torch.save
        return folder, folder
    return folder, weights


def _sharded(kind, folder, weights):
    from safetensors.torch import load_file

    tensors = load_file(weights)
    weights.unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    if kind.endswith(".bin that runs code"):
        shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, keys in shards.items():
        if shard.endswith(".bin"):
            torch.save({k: tensors[k] for k in keys}, folder / shard)
        else:
            save_file({k: tensors[k] for k in keys}, folder / shard)
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    index = folder / ("pytorch_model.bin.index.json" if kind.endswith("code") else "model.safetensors.index.json")
    if kind.endswith("shard outside the folder"):
        weight_map[names[0]] = "../elsewhere.safetensors"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if kind.endswith("huge config"):
        _edit_json(folder / "config.json", _huge_bert)
        return folder, folder
    if kind.endswith("code"):
        second = folder / "pytorch_model-00002-of-00002.bin"
        with open(second, "wb") as handle:
            pickle.dump({names[1]: _RunsCode()}, handle, protocol=2)
        return folder, second
    return folder, index


KINDS = ["built-in huge config", "built-in corrupt header", "hugging face huge config",
         "hugging face corrupt header", "hugging face .bin that runs code", "hugging face sharded huge config",
         "hugging face sharded .bin that runs code", "hugging face sharded shard outside the folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_tampered_model_folder_exits_2_naming_the_file(tmp_path, tiny_bert, capsys, monkeypatch, kind):
    folder, named = _tampered(kind, tmp_path, tiny_bert)
    texts = tmp_path / "texts.txt"
    texts.write_text("a query\n")
    monkeypatch.chdir(tmp_path)
    status = main(["encode", str(folder), "--data", str(texts), "--output", str(tmp_path / "out.npy")])
    err = capsys.readouterr().err
    assert status == errors.USAGE, err
    assert str(named) in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    cause = {"config": "does not hold the model its config.json describes", "header": "corrupt safetensors header",
             "code": "more than tensors, which could run code", "outside": "which is not a file of"}
    assert cause[next(word for word in cause if word in kind)] in err
    assert not (tmp_path / "out.npy").exists() and not (tmp_path / "ran-code.txt").exists()


@pytest.mark.parametrize("kind", ["hugging face huge config", "hugging face corrupt header",
                                  "hugging face .bin that runs code"])
def test_train_text_refuses_a_tampered_model_before_writing(tmp_path, tiny_bert, capsys, monkeypatch, kind):
    from tests.train.conftest import text_args

    folder, named = _tampered(kind, tmp_path, tiny_bert)
    monkeypatch.chdir(tmp_path)
    status = main(text_args(folder, tmp_path / "run"))
    err = capsys.readouterr().err
    assert status == errors.USAGE and f"--model {folder}" in err and str(named) in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "ran-code.txt").exists()
