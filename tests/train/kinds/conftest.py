import pytest

from tests.train.kinds.sparse_models import write_tiny_splade


@pytest.fixture(scope="session")
def tiny_splade(tmp_path_factory):
    """A tiny BERT with its masked-LM head (tests/train/kinds/sparse_models.py), written once."""
    pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    return write_tiny_splade(tmp_path_factory.mktemp("models") / "splade")
