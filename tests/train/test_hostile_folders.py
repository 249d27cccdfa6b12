"""The hostile folders and sizes of issue 40 through the program (tests/train/hostile_folders_corpus.py): each ends
with the status docs/outputs.md's table gives its name and, when refused, one error line naming the file and key
(or the option), never a traceback; the resource bombs are refused before anything of their size is built (a
guard fails any tensor, Linear or Embedding of more than 1e8 elements), and the advice a refusal gives works."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from gradcache.cli import main
from tests.train.hostile_folders_corpus import (
    BOMBS,
    CROSS_ENCODER,
    FOLDER_CASES,
    MULTI_VECTOR,
    OUTPUTS,
    SPARSE,
    write_exports,
)
from tests.train.test_hostile_corpus import statuses

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

MOST_ELEMENTS = 100_000_000  # 400 MB of float32: far above the tiny models, far below any bomb


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return write_exports(tmp_path_factory.mktemp("exports"))


class HugeAllocation(AssertionError):
    """A bomb reached an allocation of its size: its size was not checked first."""


def _elements(size: tuple) -> int:
    shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    count = 1
    for n in shape:
        count *= int(n)
    return count


@pytest.fixture
def no_huge_allocations(monkeypatch):
    """torch.empty, nn.Linear and nn.Embedding fail (HugeAllocation) when asked for more than MOST_ELEMENTS."""
    empty, linear, embedding = torch.empty, nn.Linear.__init__, nn.Embedding.__init__

    def guarded_empty(*size, **kwargs):
        if _elements(size) > MOST_ELEMENTS:
            raise HugeAllocation(f"torch.empty{size}")
        return empty(*size, **kwargs)

    def guarded_linear(self, in_features, out_features, *args, **kwargs):
        if in_features * out_features > MOST_ELEMENTS:
            raise HugeAllocation(f"nn.Linear({in_features}, {out_features})")
        linear(self, in_features, out_features, *args, **kwargs)

    def guarded_embedding(self, num_embeddings, embedding_dim, *args, **kwargs):
        if num_embeddings * embedding_dim > MOST_ELEMENTS:
            raise HugeAllocation(f"nn.Embedding({num_embeddings}, {embedding_dim})")
        embedding(self, num_embeddings, embedding_dim, *args, **kwargs)

    monkeypatch.setattr(torch, "empty", guarded_empty)
    monkeypatch.setattr(nn.Linear, "__init__", guarded_linear)
    monkeypatch.setattr(nn.Embedding, "__init__", guarded_embedding)


def _run(case, tmp_path, exports, capsys) -> tuple[int, str]:
    folder = tmp_path / "case"
    folder.mkdir()
    status = main(case.build(folder, exports))
    return status, capsys.readouterr().err


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in FOLDER_CASES])
def test_hostile_folder(case, tmp_path, exports, capsys):
    status, err = _run(case, tmp_path, exports, capsys)
    assert status == statuses()[case.status], err
    assert "Traceback" not in err, err
    if case.status == "OK":
        return
    errors = [line for line in err.splitlines() if line.startswith("gradcache: ")]
    assert len(errors) == 1, err
    for fragment in case.fragments:
        assert fragment in errors[0], (fragment, errors[0])
    run = tmp_path / "case" / "run"
    assert not run.exists() or not any(run.iterdir()), f"{case.name} wrote {list(run.iterdir())}"
    assert not any((tmp_path / "case" / name).exists() for name in OUTPUTS), f"{case.name} wrote its output"


def test_the_guard_fails_an_allocation_a_bomb_asks_for(no_huge_allocations):
    """The guard catches what the bombs built before their sizes were checked: the (2e9, hidden) projection of a
    Dense config's out_features or of --token-dim, and a tensor of as many elements."""
    with pytest.raises(HugeAllocation):
        nn.Linear(16, 2_000_000_000, bias=False)
    with pytest.raises(HugeAllocation):
        torch.empty(2_000_000_000, 16)
    assert nn.Linear(16, 8).weight.shape == (8, 16)  # the tiny models' own sizes pass


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_is_refused_before_anything_of_its_size_is_built(name, tmp_path, exports, capsys,
                                                                no_huge_allocations):
    case, = (c for c in FOLDER_CASES if c.name == name)
    status, err = _run(case, tmp_path, exports, capsys)
    assert status == statuses()["USAGE"] and "HugeAllocation" not in err, err


def test_a_pairs_length_is_the_tokenizers_at_most_the_models_positions(tmp_path, exports):
    """`pair_length` as CrossEncoder truncates: model_max_length where given and within the positions, the
    positions where it is above them or unset (transformers' sentinel), refused where it is not a length."""
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    from gradcache.models.cross_encoder import pair_length

    folder = shutil.copytree(exports / CROSS_ENCODER, tmp_path / "reranker")
    positions = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    settings = folder / "tokenizer_config.json"
    for given, expected in ((positions // 2, positions // 2), (positions * 100, positions),
                            (VERY_LARGE_INTEGER, positions), (None, positions)):
        values = {key: value for key, value in json.loads(settings.read_text()).items() if key != "model_max_length"}
        settings.write_text(json.dumps(values if given is None else {**values, "model_max_length": given}))
        assert pair_length(folder) == expected, given
    for bad in (-1, 0, 1, True, "512", [512], 512.0):
        settings.write_text(json.dumps({**values, "model_max_length": bad}))
        with pytest.raises(ValueError, match="tokenizer_config.json: model_max_length"):
            pair_length(folder)


def test_the_token_dim_option_and_the_library_share_one_ceiling():
    from gradcache.models.multi_vector import MAX_TOKEN_DIM, MultiVectorTextEncoder
    from gradcache.train.config import RunConfig

    assert RunConfig.__dataclass_fields__["token_dim"].metadata["at_most"] == MAX_TOKEN_DIM
    with pytest.raises(ValueError, match=f"from 1 to {MAX_TOKEN_DIM}"):
        MultiVectorTextEncoder(nn.Identity(), token_dim=MAX_TOKEN_DIM + 1)


def test_a_projection_of_another_width_than_the_model_is_refused(tmp_path, exports):
    """A Dense whose config and weights agree but project another hidden size than the model's is refused by the
    encoder before its projection is built."""
    from safetensors.torch import save_file

    from gradcache.models.multi_vector import MultiVectorTextEncoder

    folder = shutil.copytree(exports / MULTI_VECTOR, tmp_path / "multi-vector")
    save_file({"linear.weight": torch.zeros(4, 12)}, str(folder / "1_Dense" / "model.safetensors"))
    dense = folder / "1_Dense" / "config.json"
    dense.write_text(json.dumps({**json.loads(dense.read_text()), "in_features": 12, "out_features": 4}))
    with pytest.raises(ValueError, match="projects 12 features, but the model .* has hidden size 16"):
        MultiVectorTextEncoder(folder)


@pytest.mark.slow
@pytest.mark.parametrize("kind, given", [(SPARSE, "multi-vector"), (MULTI_VECTOR, "dense")])
def test_the_advice_of_a_folder_of_another_kind_works(kind, given, tmp_path, exports, capsys):
    """The refusal's advice, followed: a copy of the folder without its modules.json trains --kind `given`."""
    from tests.train.hostile_folders_corpus import _pairs
    from tests.train.conftest import TINY

    folder = shutil.copytree(exports / kind, tmp_path / kind)
    (folder / "modules.json").unlink()
    argv = ["train", "text", "--model", str(folder), *TINY["text"], "--steps", "1", "--data", str(_pairs(tmp_path)),
            "--output-dir", str(tmp_path / "run"), "--kind", given]
    assert main(argv) == 0, capsys.readouterr().err
