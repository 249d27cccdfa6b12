"""`gradcache train text` on a tiny decoder LLM with last-token pooling and prompts: the prompts reach training,
the evaluation and `gradcache encode`; RUN/model loads in sentence-transformers and its `encode(...,
prompt_name=...)` equals `gradcache encode`; mean pooling without the prompt's tokens exports as include_prompt."""
import json

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.models import HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from tests.tiny_decoder_model import write_tiny_decoder
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
QUERY_PROMPT, PASSAGE_PROMPT = "query: ", "passage: "
TEXTS = ["who keeps bees in quillby?", "orvel daskin is a dentist.", "a pilot", "x" * 40]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Left padding, BOS added by the tokenizer, EOS appended by the program."""
    return write_tiny_decoder(tmp_path_factory.mktemp("models") / "llama", "llama", padding_side="left")


@pytest.fixture(scope="module")
def prompted_run(tmp_path_factory, llama):
    folder = tmp_path_factory.mktemp("runs") / "prompted"
    assert main(text_args(llama, folder, "--pooling", "last", "--query-prompt", QUERY_PROMPT,
                          "--passage-prompt", PASSAGE_PROMPT)) == 0
    return folder


def _encode(tmp_path, model, tower, *extra) -> np.ndarray:
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / f"{tower}{len(extra)}.npy"
    assert main(["encode", str(model), "--data", str(tmp_path / "texts.txt"), "--output", str(output),
                 "--tower", tower, "--batch-size", "3", *extra]) == 0
    return np.load(output)


def _normalized(embeddings) -> np.ndarray:
    embeddings = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
    return torch.nn.functional.normalize(embeddings, dim=-1).numpy()


def test_the_run_stores_its_prompts_and_exports_them_for_sentence_transformers(prompted_run):
    config = RunConfig.from_dict(load_checkpoint(prompted_run)["args"])
    assert (config.pooling, config.query_prompt, config.passage_prompt) == ("last", QUERY_PROMPT, PASSAGE_PROMPT)
    assert config.exclude_prompt_from_pooling is False
    exported = prompted_run / "model"
    settings = json.loads((exported / "config_sentence_transformers.json").read_text())
    assert settings["prompts"] == {"query": QUERY_PROMPT, "document": PASSAGE_PROMPT}
    pooling = json.loads((exported / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_lasttoken"] and not pooling["pooling_mode_mean_tokens"]
    assert pooling["include_prompt"] is True


@pytest.mark.parametrize("tower", ["query", "passage"])
def test_encode_prepends_the_side_prompt_and_pools_the_eos_token(tmp_path, prompted_run, tower):
    """The reference: the exported model applied to prompt + text, tokenised in the test, pooled at the EOS."""
    prompt = QUERY_PROMPT if tower == "query" else PASSAGE_PROMPT
    from_run = _encode(tmp_path, prompted_run, tower)
    from_folder = _encode(tmp_path, prompted_run / "model", tower)
    np.testing.assert_allclose(from_folder, from_run, atol=2e-6)
    encoder = HuggingFaceEncoder(prompted_run / "model").eval()
    assert encoder.pooling == "last"
    tokenizer = HuggingFaceTokenizer(prompted_run / "model", max_length=24)
    for row, text in enumerate(TEXTS):
        tokens = tokenizer.tokenizer([prompt + text], truncation=True, max_length=24, return_tensors="pt")
        assert tokens["input_ids"][0, -1] == tokenizer.tokenizer.eos_token_id
        with torch.no_grad():
            hidden = encoder.model(**tokens).last_hidden_state[0, -1]  # one text, no padding: its last token
        np.testing.assert_allclose(from_run[row], _normalized(hidden[None])[0], atol=2e-6)
    # the prompt is what makes the sides differ: the same texts without it embed otherwise
    unprompted = _encode(tmp_path, prompted_run / "model", tower, f"--{tower}-prompt", "none: ")
    assert np.abs(unprompted - from_run).max() > 1e-3


def test_sentence_transformers_encode_with_prompt_name_equals_gradcache_encode(tmp_path, prompted_run):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    loaded = sentence_transformers.SentenceTransformer(str(prompted_run / "model"), device="cpu",
                                                       local_files_only=True)
    for tower, prompt_name in (("query", "query"), ("passage", "document")):
        want = _encode(tmp_path, prompted_run, tower)
        got = loaded.encode(TEXTS, prompt_name=prompt_name, batch_size=3, normalize_embeddings=True)
        np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(loaded.encode_query(TEXTS, normalize_embeddings=True),
                               _encode(tmp_path, prompted_run, "query"), atol=2e-5)


def test_the_prompts_reach_training(tmp_path, llama, prompted_run):
    """The same run without prompts has another first loss (the same seed, model and rows; no dropout), and the
    same run with them the same first loss."""
    import csv

    def first_loss(folder):
        with open(folder / "train_log.csv", newline="") as handle:
            return float(next(row["loss"] for row in csv.DictReader(handle) if row["step"] == "1"))

    prompts = ["--query-prompt", QUERY_PROMPT, "--passage-prompt", PASSAGE_PROMPT]
    assert main(text_args(llama, tmp_path / "plain", "--pooling", "last", "--steps", "1")) == 0
    assert main(text_args(llama, tmp_path / "again", "--pooling", "last", "--steps", "1", *prompts)) == 0
    assert first_loss(tmp_path / "again") == pytest.approx(first_loss(prompted_run), rel=1e-6)
    assert abs(first_loss(tmp_path / "plain") - first_loss(prompted_run)) > 1e-4


def test_a_prompt_left_out_of_mean_pooling_exports_as_include_prompt_false(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    qwen = write_tiny_decoder(tmp_path / "qwen2", "qwen2", bos=False, padding_side="right")
    run = tmp_path / "run"
    assert main(text_args(qwen, run, "--pooling", "mean", "--query-prompt", QUERY_PROMPT,
                          "--exclude-prompt-from-pooling")) == 0
    assert json.loads((run / "model" / "1_Pooling" / "config.json").read_text())["include_prompt"] is False
    assert HuggingFaceEncoder(run / "model").include_prompt is False
    want = _encode(tmp_path, run, "query")
    loaded = sentence_transformers.SentenceTransformer(str(run / "model"), device="cpu", local_files_only=True)
    got = loaded.encode(TEXTS, prompt_name="query", batch_size=3, normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=2e-5)
    # the reference: the mean over the tokens after the prompt (its words; no BOS here), computed in the test
    encoder = HuggingFaceEncoder(run / "model").eval()
    tokenizer = HuggingFaceTokenizer(run / "model", max_length=24).tokenizer
    skipped = len(tokenizer(QUERY_PROMPT)["input_ids"]) - 1  # the prompt's tokens, less the EOS
    for row, text in enumerate(TEXTS):
        tokens = tokenizer([QUERY_PROMPT + text], truncation=True, max_length=24, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder.model(**tokens).last_hidden_state[0]  # (L, H)
        np.testing.assert_allclose(want[row], _normalized(hidden[skipped:].mean(dim=0)[None])[0], atol=2e-6)


@pytest.mark.parametrize(("extra", "fragments"), [
    (["--query-prompt", ""], ["--query-prompt ''", "empty"]),
    (["--passage-prompt", "  "], ["--passage-prompt '  '", "empty"]),
    (["--exclude-prompt-from-pooling"], ["--exclude-prompt-from-pooling", "--query-prompt"]),
    (["--query-prompt", "q: ", "--exclude-prompt-from-pooling", "--pooling", "last"],
     ["--exclude-prompt-from-pooling applies to mean pooling", "--pooling last"]),
    (["--pooling", "max"], ["--pooling", "'max'"]),
])
def test_bad_prompt_and_pooling_options_exit_2_before_anything_is_written(tmp_path, llama, capsys, extra,
                                                                        fragments):
    assert main(text_args(llama, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err
    assert all(fragment in err for fragment in fragments), err
    assert not (tmp_path / "out").exists()


def test_a_run_refuses_prompts_given_to_encode(tmp_path, prompted_run, capsys):
    (tmp_path / "texts.txt").write_text("a\n")
    assert main(["encode", str(prompted_run), "--data", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "e.npy"), "--query-prompt", "other: "]) == 2
    assert "prompts as it was trained" in capsys.readouterr().err


def test_an_older_run_reads_as_one_without_prompts():
    stored = RunConfig(mode="text").to_dict()
    for name in ("query_prompt", "passage_prompt", "exclude_prompt_from_pooling"):
        stored.pop(name)
    read = RunConfig.from_dict({**stored, "config_version": 10})
    assert (read.query_prompt, read.passage_prompt, read.exclude_prompt_from_pooling) == (None, None, False)


def test_mine_and_eval_of_a_run_tokenise_each_side_after_its_prompt(prompted_run):
    """encode, eval and mine embed through `LoadedModel.side_tokenizer`: a run's sides take its prompts."""
    from gradcache.train.commands.model import load_model

    loaded = load_model(str(prompted_run))
    plain = HuggingFaceTokenizer(prompted_run / "model", max_length=24)
    for tower, prompt in (("query", QUERY_PROMPT), ("passage", PASSAGE_PROMPT)):
        tokens = loaded.side_tokenizer(tower)(TEXTS)
        assert torch.equal(tokens["input_ids"], plain([prompt + text for text in TEXTS])["input_ids"])
        assert tokens["prompt_length"].tolist() == [plain.prompt_length(prompt)] * len(TEXTS)


def test_a_resume_keeps_the_prompts_and_refuses_others(tmp_path, prompted_run, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(prompted_run, run)
    assert main(["train", "text", "--resume", str(run), "--query-prompt", "other: ", "--steps", "3", "--quiet"]) == 2
    assert "--query-prompt" in capsys.readouterr().err
    assert main(["train", "text", "--resume", str(run), "--steps", "3", "--quiet"]) == 0
    config = RunConfig.from_dict(load_checkpoint(run)["args"])
    assert (config.query_prompt, config.passage_prompt) == (QUERY_PROMPT, PASSAGE_PROMPT)
    assert json.loads((run / "model" / "config_sentence_transformers.json").read_text())["prompts"]["query"] == (
        QUERY_PROMPT)
