"""`--query-expansion` of `--kind multi-vector` (ColBERT's query expansion): the query tokens equal
sentence-transformers' `MultiVectorEncoder.preprocess(task="query")`; a GradCache step equals the MaxSim InfoNCE of
each text encoded alone with its expansion positions scored (float64, every parameter), and dropping them gives
another loss; the export carries the expansion as `MultiVectorEncoder.save` writes it and encodes queries as the
run and `gradcache encode` do; a folder that expands is trained with its expansion; bad options exit 2."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.models.multi_vector_folder import read_multi_vector_folder
from gradcache.models.query_expansion import QueryExpansion
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.commands.model import load_run
from gradcache.train.config import RunConfig
from gradcache.train.eval.maxsim import embed_token_texts
from gradcache.train.modes import TEXT_KINDS
from gradcache.train.modes.text_folders import side_tokenizers
from gradcache.train.strategy_choice import build_strategy
from tests.train.conftest import text_args
from tests.train.kinds.test_multi_vector import _grads, _maxsim, assert_same_step

transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
AutoTokenizer = transformers.AutoTokenizer
LENGTH = 12
# the tiny tokenizer reads one token per character (spaces aside), with [CLS] and [SEP]: "who bakes bread?" is 16
# tokens (truncated to LENGTH), "where is" 9 (expanded by 3), "the river's name" 16, "a" 3
QUERIES = ["who bakes bread?", "where is", "the river's name", "a"]
PASSAGES = [  # per query: its positive, then its hard negative
    ["the baker bakes bread.", "the smith forges"], ["the mill stands by the river", "no mill here"],
    ["the river is called ada", "a lake, not a river"], ["b", "an unrelated and rather long passage of text"],
]
PROMPT = "q: "
KIND = ["--kind", "multi-vector", "--token-dim", "8", "--temperature", "1", "--negatives-per-query", "1"]


def _config(folder, attend: bool, **changes) -> RunConfig:
    return RunConfig(mode="text", kind="multi-vector", model=str(folder), max_length=24, token_dim=8,
                     query_expansion=LENGTH, attend_to_expansion=attend, **changes)


@pytest.mark.parametrize("attend", [False, True])
@pytest.mark.parametrize("prompt", [None, PROMPT])
def test_query_tokens_equal_multi_vector_encoder_preprocess(tiny_bert, attend, prompt):
    from sentence_transformers import MultiVectorEncoder

    peer = MultiVectorEncoder(str(tiny_bert), device="cpu", local_files_only=True)
    peer[0].query_expansion = {"strategy": "fixed", "attend": attend, "length": LENGTH}
    query_tokens, passage_tokens = side_tokenizers(_config(tiny_bert, attend, query_prompt=prompt))
    ours, theirs = query_tokens(QUERIES), peer.preprocess(QUERIES, prompt=prompt, task="query")
    for key in ("input_ids", "attention_mask", "query_expansion_positions"):
        assert torch.equal(ours[key], theirs[key]), key
    expanded = ours["query_expansion_positions"]
    assert expanded.dtype == torch.bool and ours["input_ids"].shape == (len(QUERIES), LENGTH)
    assert expanded[3].sum() > 0 and expanded[0].sum() == 0  # one query expanded, one truncated
    assert torch.equal(ours["attention_mask"].bool(), ~expanded | attend)
    assert "query_expansion_positions" not in passage_tokens(PASSAGES[0])  # passages are never expanded


@pytest.mark.parametrize("attend", [False, True])
def test_a_gradcache_step_scores_the_expansion_as_each_query_alone(tiny_bert, attend):
    """Chunks of 2 queries and 4 passages, padding trimmed, against each text encoded alone (a query alone is
    still LENGTH tokens, its expansion scored), MaxSim by loops: loss and every parameter's gradient, float64.
    Dropping the expansion positions from the scoring gives another loss."""
    kind = TEXT_KINDS["multi-vector"]
    config = _config(tiny_bert, attend, temperature=0.5, negatives_per_query=1, chunk_size=2)
    torch.manual_seed(0)
    model = kind.build_model(config).double()
    query_tokens, passage_tokens = side_tokenizers(config)
    passages = [p for group in PASSAGES for p in group]
    queries = query_tokens(QUERIES)
    assert queries["query_expansion_positions"].any()
    strategy = build_strategy(config, kind.encoders(model), kind.build_loss(config).double(), None,
                              kind.trim_padding, kind.chunk_sizes(config))
    loss = strategy.step(queries, passage_tokens(passages))
    got = _grads(model)
    model.zero_grad()

    plain = AutoTokenizer.from_pretrained(str(tiny_bert))

    def query_alone(text):
        """ColBERT's expansion by hand: the query's own tokens (at most LENGTH), then [MASK] up to LENGTH, attended
        only with `attend`; every one of the LENGTH vectors scored. Returns them and the real tokens' count."""
        ids = plain(text, truncation=True, max_length=LENGTH)["input_ids"]
        real = len(ids)
        ids = torch.tensor([ids + [plain.mask_token_id] * (LENGTH - real)])  # (1, LENGTH)
        attended = torch.tensor([[1] * real + [int(attend)] * (LENGTH - real)])
        return model.encode_query(input_ids=ids, attention_mask=attended).values[0], real

    def passage_alone(text):
        embedded = model.encode_query(**passage_tokens([text]))
        assert embedded.mask.all()  # no padding at all
        return embedded.values[0]

    query_vectors = [query_alone(q) for q in QUERIES]
    assert [real < LENGTH for _, real in query_vectors] == [False, True, False, True]
    documents = [passage_alone(p) for p in [g[0] for g in PASSAGES] + [g[1] for g in PASSAGES]]

    def infonce(vectors):
        logits = torch.stack([torch.stack([_maxsim(q, d) for d in documents]) for q in vectors]) / 0.5
        return torch.nn.functional.cross_entropy(logits, torch.arange(len(QUERIES)))

    want_loss = infonce([q for q, _ in query_vectors])
    want_loss.backward()
    want = _grads(model)
    assert_same_step(loss, got, want_loss, want)
    # the negative control: the same vectors, the expansion positions not scored
    unexpanded = infonce([q[:real] for q, real in query_vectors])
    assert not torch.allclose(unexpanded, want_loss, rtol=1e-3, atol=0)


@pytest.fixture(scope="module", params=[False, True], ids=["scored", "attended"])
def run(request, tmp_path_factory, tiny_bert):
    folder = tmp_path_factory.mktemp("expansion") / "run"
    attend = ["--attend-to-expansion"] if request.param else []
    argv = text_args(tiny_bert, folder, *KIND, "--query-expansion", str(LENGTH), *attend, "--query-prompt", PROMPT,
                     "--steps", "1")
    assert main(argv) == 0
    return folder, request.param


@pytest.mark.slow
def test_the_export_writes_the_expansion_as_multi_vector_encoder_saves_it(run, tiny_bert, tmp_path):
    from sentence_transformers import MultiVectorEncoder

    folder, attend = run
    peer = MultiVectorEncoder(str(tiny_bert), device="cpu", local_files_only=True)
    peer[0].query_expansion = {"strategy": "fixed", "attend": attend, "length": LENGTH}
    peer.save(str(tmp_path / "peer"))
    theirs = json.loads((tmp_path / "peer" / "sentence_bert_config.json").read_text())
    ours = json.loads((folder / "model" / "sentence_bert_config.json").read_text())
    assert ours["query_expansion"] == theirs["query_expansion"]
    assert ours["query_expansion"] == {"strategy": "fixed", "attend": attend, "token": None, "length": LENGTH}


def test_encode_query_of_the_export_equals_the_run_and_gradcache_encode(run, tmp_path):
    from sentence_transformers import MultiVectorEncoder

    folder, attend = run
    peer = MultiVectorEncoder(str(folder / "model"), device="cpu", local_files_only=True)
    assert peer[0].query_expansion == {"strategy": "fixed", "attend": attend, "token": None, "length": LENGTH}
    theirs = peer.encode_query(QUERIES)
    config, model, _ = load_run(folder)
    with torch.inference_mode():
        ours = embed_token_texts(model.encode_query, side_tokenizers(config)[0], QUERIES, torch.device("cpu"))
    texts = tmp_path / "queries.txt"
    texts.write_text("\n".join(QUERIES) + "\n", encoding="utf-8")
    for source in (folder, folder / "model"):
        output = tmp_path / f"{source.name}.npz"
        assert main(["encode", str(source), "--data", str(texts), "--output", str(output), "--tower", "query"]) == 0
        written = np.load(output)
        offsets = written["offsets"]
        assert np.all(np.diff(offsets) == LENGTH)  # every query exactly LENGTH scored tokens
        for i, want in enumerate(theirs):
            np.testing.assert_allclose(written["values"][offsets[i]:offsets[i + 1]], want.numpy(), rtol=1e-5,
                                       atol=1e-6)
    for mine, peer_tokens in zip(ours, theirs):
        assert mine.shape == peer_tokens.shape == (LENGTH, 8)
        torch.testing.assert_close(mine, peer_tokens, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_folder_that_expands_trains_with_its_expansion_unless_given(run, tmp_path, capsys):
    folder, attend = run
    assert read_multi_vector_folder(folder / "model").query_expansion == QueryExpansion(LENGTH, attend)
    capsys.readouterr()

    def argv(output, *extra):
        return text_args(folder / "model", tmp_path / output, *KIND, "--steps", "1", *extra)

    assert main(argv("folder")) == 0
    config = RunConfig.from_dict(load_checkpoint(tmp_path / "folder")["args"])
    assert (config.query_expansion, config.attend_to_expansion) == (LENGTH, attend)
    assert f"--query-expansion {LENGTH}" in capsys.readouterr().err
    exported = json.loads((tmp_path / "folder" / "model" / "sentence_bert_config.json").read_text())
    assert exported["query_expansion"]["length"] == LENGTH
    if not attend:  # given options win over the folder's
        assert main(argv("given", "--query-expansion", "6", "--attend-to-expansion")) == 0
        config = RunConfig.from_dict(load_checkpoint(tmp_path / "given")["args"])
        assert (config.query_expansion, config.attend_to_expansion) == (6, True)


@pytest.mark.parametrize("change, named", [({"strategy": "min"}, "strategy 'min'"),
                                           ({"token": "[UNK]"}, r"token '\[UNK\]'"),
                                           ({"length": 1}, "at least 2")])
def test_a_folder_with_an_expansion_this_program_cannot_compute_is_refused(run, tmp_path, change, named):
    folder = shutil.copytree(run[0] / "model", tmp_path / "model")
    settings = folder / "sentence_bert_config.json"
    values = json.loads(settings.read_text())
    values["query_expansion"].update(change)
    settings.write_text(json.dumps(values))
    with pytest.raises(ValueError, match=named):
        read_multi_vector_folder(folder)


def test_bad_expansions_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="length=1 must be at least 2"):
        QueryExpansion(1)
    with pytest.raises(TypeError, match="length must be an int"):
        QueryExpansion(8.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attend must be a bool"):
        QueryExpansion(8, attend=1)  # type: ignore[arg-type]
    no_mask = SimpleNamespace(mask_token_id=None, eos_token_id=7)
    assert QueryExpansion(8).token_id(no_mask) == 7  # a decoder's EOS, as sentence-transformers falls back
    with pytest.raises(ValueError, match="neither a mask token nor an EOS token"):
        QueryExpansion(8).token_id(SimpleNamespace(mask_token_id=None, eos_token_id=None))


@pytest.mark.parametrize("options, message", [
    (["--kind", "multi-vector", "--attend-to-expansion"], "add --query-expansion LENGTH"),
    (["--kind", "multi-vector", "--query-expansion", "1"], "--query-expansion 1: must be at least 2"),
    (["--query-expansion", "8"], "--query-expansion 8 is read by --kind multi-vector alone"),
    (["--attend-to-expansion"], "--attend-to-expansion True is read by --kind multi-vector alone"),
])
def test_bad_expansion_options_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys, options, message):
    assert main(text_args(tiny_bert, tmp_path / "run", *options)) == 2
    err = capsys.readouterr().err
    assert message in err, err
    if "--attend-to-expansion" in options and "multi-vector" in options:
        assert "--attend-to-expansion" in err
    assert not (tmp_path / "run").exists()
