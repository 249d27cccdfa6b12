"""A new kind of text model is one module and one registry line: the toy kind of tests/train/kinds/toy_kind.py,
registered here into `TEXT_KINDS` and nowhere else, is trained, evaluated, encoded and exported by the program as
it stands, and its outputs are checked against the bag of embeddings computed here from the trained table."""
import json

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.train.modes import TEXT_KINDS
from tests.train.conftest import text_args
from tests.train.kinds.toy_kind import SETTINGS, WEIGHTS, Bag

TEXTS = ["who bakes bread", "the miller grinds wheat", "a baker lives by the river"]
PAIRS = [("who bakes bread", "the baker bakes bread"), ("who grinds wheat", "the miller grinds wheat"),
         ("who sails", "the sailor sails the sea"), ("who sings", "the singer sings at night")]


@pytest.fixture
def bag_kind(monkeypatch):
    monkeypatch.setitem(TEXT_KINDS, Bag.kind, Bag())  # the one registry line a new kind adds


def reference_embeddings(table: torch.Tensor, tokenizer, texts: list[str]) -> np.ndarray:
    """The bag of each text's token embeddings, L2-normalised, from the table itself."""
    tokens = tokenizer(texts)
    mask = tokens["attention_mask"].unsqueeze(-1).float()  # (N, L, 1)
    bags = (table[tokens["input_ids"]] * mask).sum(1) / mask.sum(1)  # (N, D)
    return torch.nn.functional.normalize(bags, dim=1).numpy()


@pytest.mark.slow
def test_a_toy_kind_trains_evaluates_encodes_and_exports(bag_kind, tiny_bert, tmp_path):
    from safetensors.torch import load_file

    from gradcache.models import HuggingFaceTokenizer

    run = tmp_path / "run"
    assert main(text_args(tiny_bert, run, "--kind", "bag")) == 0
    table = load_file(run / "model" / WEIGHTS)["embedding.weight"]
    assert json.loads((run / "model" / SETTINGS).read_text())["width"] == table.shape[1]
    assert "gradcache train text --kind bag" in (run / "model" / "README.md").read_text()
    tokenizer = HuggingFaceTokenizer(tiny_bert, 24)

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    want = reference_embeddings(table, tokenizer, TEXTS)
    for name, model in (("run", run), ("folder", run / "model")):
        output = tmp_path / f"{name}.npy"
        assert main(["encode", str(model), "--data", str(texts), "--output", str(output)]) == 0
        np.testing.assert_allclose(np.load(output), want, rtol=1e-5, atol=1e-6)

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in PAIRS), encoding="utf-8")
    queries = reference_embeddings(table, tokenizer, [q for q, _ in PAIRS])
    passages = reference_embeddings(table, tokenizer, [p for _, p in PAIRS])
    recall_at_1 = 100.0 * np.mean((queries @ passages.T).argmax(1) == np.arange(len(PAIRS)))
    for name, model in (("run", run), ("folder", run / "model")):
        output = tmp_path / f"{name}.json"
        assert main(["eval", str(model), "--data", str(pairs), "--output", str(output)]) == 0
        assert json.loads(output.read_text())["recall@1"] == pytest.approx(recall_at_1)
    assert main(["eval", str(run), "--output", str(tmp_path / "held_out.json")]) == 0
    held_out = json.loads((tmp_path / "held_out.json").read_text())
    assert held_out["recall@1"] == pytest.approx(json.loads((run / "metrics.json").read_text())["recall@1"])

    again = tmp_path / "again"
    assert main(["export", str(run), "--output", str(again)]) == 0
    torch.testing.assert_close(load_file(again / WEIGHTS)["embedding.weight"], table, rtol=0, atol=0)
    assert main(["export", str(run)]) == 0  # its own format is one an export wrote: replaced
    torch.testing.assert_close(load_file(run / "model" / WEIGHTS)["embedding.weight"], table, rtol=0, atol=0)
