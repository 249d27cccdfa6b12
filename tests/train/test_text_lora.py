"""`gradcache train text --lora-rank R`: only the adapter trains (and has optimizer state), the checkpoint holds
the adapter alone and resumes exactly, RUN/model holds the merged model and the PEFT adapter, and bad LoRA options
exit 2 before anything is written. The tiny BERT of tests/tiny_text_model.py, 2 steps."""
from __future__ import annotations

import csv
import sys

import pytest
import torch

from gradcache.cli import main
from gradcache.models import HuggingFaceTokenizer
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.train.conftest import text_args
from tests.train.export.helpers import program_model

transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
peft = pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
TEXTS = ["which baker in quillby keeps bees?", "orvel daskin is a dentist in quillby.", "a pilot"]
LORA = ["--lora-rank", "2", "--lora-dropout", "0.1"]


@pytest.fixture(scope="module")
def lora_run(tiny_bert, tmp_path_factory):
    """One shared-tower LoRA run (dropout on), its stderr, and the optimizer it built with the names of its
    parameters."""
    from gradcache.train import run

    folder = tmp_path_factory.mktemp("lora") / "run"
    built = {}

    def recording(name, modules, *args, **kwargs):
        optimizer = original(name, modules, *args, **kwargs)
        built["names"] = {id(p): n for module in modules for n, p in module.named_parameters()}
        built["optimizer"] = optimizer
        return optimizer

    original = run.build_optimizer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "build_optimizer", recording)
        capture = _Stderr(patch)
        assert main(text_args(tiny_bert, folder, *LORA)) == 0
    return folder, capture.text(), built


class _Stderr:
    """What the program writes to sys.stderr (a module-scoped fixture cannot use capsys)."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        import io

        self.buffer = io.StringIO()
        patch.setattr(sys, "stderr", self.buffer)

    def text(self) -> str:
        return self.buffer.getvalue()


@pytest.mark.slow
def test_only_the_adapter_is_optimised_and_saved(lora_run):
    folder, stderr, built = lora_run
    optimised = [built["names"][id(p)] for group in built["optimizer"].param_groups for p in group["params"]]
    assert optimised and all(".lora_A." in name or ".lora_B." in name for name in optimised)
    _, model, _ = program_model(folder)
    lora_names = {name for name, _ in model.named_parameters() if "lora_" in name}
    assert set(optimised) == lora_names  # every LoRA parameter, nothing else
    state = load_checkpoint(folder)
    assert set(state["model"]) == lora_names  # the base weights come from --model
    assert len(state["optimizer"]["state"]) == len(lora_names)
    assert "LoRA rank 2, alpha 4, dropout 0.1 on query, value (peft's default for bert)" in stderr
    size = (folder / "last.pt").stat().st_size / 2**20
    assert f"last.pt holds the model's {sum(model.get_parameter(n).numel() for n in lora_names):,} trained " \
           f"parameters and their optimizer state, {size:.2f} MiB" in stderr


def test_the_base_stays_as_pretrained(lora_run, tiny_bert):
    folder, _, _ = lora_run
    _, model, _ = program_model(folder)
    base = transformers.AutoModel.from_pretrained(str(tiny_bert)).state_dict()
    tower = model.query_tower.model.get_base_model()
    for name, value in tower.state_dict().items():
        if "lora_" not in name and name.replace("base_layer.", "") in base:
            assert torch.equal(value, base[name.replace("base_layer.", "")]), name
    assert any(p.abs().max() > 0 for n, p in model.named_parameters() if "lora_B" in n)  # B left zero: trained


def _mean_pooled(model, tokens):
    hidden = model(**tokens).last_hidden_state  # (B, L, H)
    mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * mask).sum(1) / mask.sum(1)  # (B, H)


def test_the_model_folder_holds_the_merged_model_and_the_adapter(lora_run, tiny_bert):
    """PeftModel.from_pretrained(base, RUN/model/adapter) and SentenceTransformer(RUN/model) (merged) embed as the
    program's own model, rebuilt from the checkpoint, does; the base model alone does not."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder, _, _ = lora_run
    config, model, _ = program_model(folder)
    tokens = HuggingFaceTokenizer(config.model, config.max_length)(TEXTS)
    with torch.no_grad():
        want = model.encode_query(**tokens)
        adapted = peft.PeftModel.from_pretrained(transformers.AutoModel.from_pretrained(str(tiny_bert)),
                                                 str(folder / "model" / "adapter")).eval()
        torch.testing.assert_close(_mean_pooled(adapted, tokens), want)
        base = _mean_pooled(transformers.AutoModel.from_pretrained(str(tiny_bert)).eval(), tokens)
    assert (base - want).abs().max() > 1e-4
    merged = sentence_transformers.SentenceTransformer(str(folder / "model"), device="cpu", local_files_only=True)
    got = merged.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # merging rounds W + (alpha / r) B A once


@pytest.mark.slow
def test_gradcache_export_writes_the_adapter_of_the_checkpoint(lora_run, tmp_path):
    folder, _, _ = lora_run
    assert main(["export", str(folder), "--output", str(tmp_path / "again")]) == 0
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        again, first = (root / "adapter" / name for root in (tmp_path / "again", folder / "model"))
        assert again.read_bytes() == first.read_bytes(), name


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


@pytest.mark.slow  # two runs and a resume
def test_resume_from_the_adapter_checkpoint_equals_an_uninterrupted_run(tmp_path, tiny_bert, killed_after_step):
    """4 steps at once, and 4 steps killed after step 3 (the checkpoint of step 2: adapter and optimizer state)
    then resumed: the same losses (dropout on) and the same adapter."""
    argv = text_args(tiny_bert, tmp_path / "whole", *LORA, "--steps", "4", "--checkpoint-every", "2")
    assert main(argv) == 0
    cut = text_args(tiny_bert, tmp_path / "cut", *LORA, "--steps", "4", "--checkpoint-every", "2")
    killed_after_step(3, cut)
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    assert main(["train", "text", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / d)["model"] for d in ("whole", "cut"))
    assert whole.keys() == resumed.keys() and all("lora_" in name for name in whole)
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


@pytest.mark.slow  # two runs
def test_gradcache_with_checkpointing_and_token_chunks_trains_the_adapter_of_the_full_batch(tmp_path, tiny_bert):
    """LoRA dropout off (the strategies draw other masks), --grad-checkpointing and --chunk-tokens: GradCache's
    adapter after 3 steps is the full batch's."""
    options = ["--lora-rank", "2", "--lora-dropout", "0", "--lora-targets", "query,key,value,dense", "--steps", "3"]
    assert main(text_args(tiny_bert, tmp_path / "cached", *options, "--grad-checkpointing", "--chunk-tokens",
                          "40")) == 0
    assert main(text_args(tiny_bert, tmp_path / "full", *options, "--strategy", "full")) == 0
    cached, full = (load_checkpoint(tmp_path / d)["model"] for d in ("cached", "full"))
    assert cached.keys() == full.keys() and any(".dense.lora_A" in name for name in cached)
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # a second run
def test_separate_towers_each_get_their_own_adapter(tmp_path, tiny_bert):
    assert main(text_args(tiny_bert, tmp_path, *LORA, "--separate-towers", "--steps", "1")) == 0
    state = load_checkpoint(tmp_path)["model"]
    for tower in (0, 1):
        assert any(name.startswith(f"towers.{tower}.") for name in state)
    assert all("lora_" in name for name in state)
    for side in ("query", "passage"):
        assert (tmp_path / "model" / side / "adapter" / "adapter_model.safetensors").is_file()
        assert (tmp_path / "model" / side / "modules.json").is_file()


def _fails(argv, capsys, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_lora_options_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys):
    out = tmp_path / "out"
    _fails(text_args(tiny_bert, out, "--lora-rank", "0"), capsys, "--lora-rank 0: must be at least 1")
    for dropout in ("1", "-0.1"):
        _fails(text_args(tiny_bert, out, "--lora-rank", "4", "--lora-dropout", dropout), capsys,
               f"--lora-dropout {float(dropout)}: must be in [0, 1)")
    _fails(text_args(tiny_bert, out, "--lora-rank", "4", "--lora-alpha", "0"), capsys, "--lora-alpha 0.0")
    _fails(text_args(tiny_bert, out, "--lora-rank", "4", "--lora-targets", "query,attn_q"), capsys,
           "--lora-targets query,attn_q: 'attn_q' matches no module",
           "named dense, key, position_embeddings, query, token_type_embeddings, value")
    _fails(text_args(tiny_bert, out, "--lora-rank", "4", "--lora-targets", "LayerNorm"), capsys,
           "--lora-targets LayerNorm: peft refuses them", "is not supported")
    _fails(text_args(tiny_bert, out, "--lora-alpha", "8", "--lora-targets", "query"), capsys,
           "--lora-alpha, --lora-targets set LoRA adapters, which need --lora-rank R")
    _fails(text_args(tiny_bert, out, "--lora-targets", "query,"), capsys, "--lora-targets",
           "not a comma-separated list")
    assert not out.exists()


def test_lora_without_peft_names_the_extra(tmp_path, tiny_bert, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` fail
    _fails(text_args(tiny_bert, tmp_path / "out", "--lora-rank", "4"), capsys, 'pip install -e ".[lora]"')
    assert not (tmp_path / "out").exists()


def _train_on_rank(rank: int, world_size: int, argv: list[str]) -> int:
    return main(argv)  # over the process group run_on_ranks started


@pytest.mark.slow  # two processes
def test_two_ranks_train_the_adapter_of_one_process(tmp_path, tiny_bert):
    """DDP over the LoRA towers (the frozen base is not reduced): two gloo ranks, each half the batch, train the
    adapter one process trains on the whole batch (LoRA dropout off: the ranks draw other masks)."""
    from tests.multiprocess import run_on_ranks

    options = ["--lora-rank", "2", "--lora-dropout", "0", "--chunk-size", "2"]
    two = text_args(tiny_bert, tmp_path / "two", *options, "--threads", "1")  # forked ranks: one OpenMP thread
    assert run_on_ranks(_train_on_rank, 2, two) == [0, 0]
    assert main(text_args(tiny_bert, tmp_path / "one", *options)) == 0
    assert [float(x) for x in _losses(tmp_path / "two")] == pytest.approx([float(x) for x in _losses(tmp_path / "one")],
                                                                         rel=1e-5)
    two, one = (load_checkpoint(tmp_path / d)["model"] for d in ("two", "one"))
    assert two.keys() == one.keys() and all("lora_" in name for name in one)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-7, msg=name)
