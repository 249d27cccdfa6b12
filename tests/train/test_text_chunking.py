"""`gradcache train text --memory-budget --chunk-tokens` (the library's memory_budget and chunk_tokens options in text mode) and `--data world-hard`,
through main([...]) on a tiny BERT written by the test."""
import json

import pytest
import torch

import gradcache
from gradcache.cli import main
from gradcache.train import strategy_choice
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')


def _args(model, output_dir, *extra):
    return text_args(model, output_dir, "--steps", "3", *extra)


def test_the_options_reach_gradcache_and_train_the_full_batch_model(tmp_path, tiny_bert, monkeypatch):
    built = []

    class Recorded(gradcache.GradCache):
        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            built.append(self.options)

    monkeypatch.setitem(strategy_choice.STRATEGIES, "gradcache", Recorded)
    chunked = ["--chunk-tokens", "40", "--memory-budget", "1K"]
    assert main(_args(tiny_bert, tmp_path / "chunked", "--data", "world-hard", *chunked)) == 0
    assert main(_args(tiny_bert, tmp_path / "full", "--data", "world-hard", "--strategy", "full")) == 0
    assert built and all(o["chunk_tokens"] == 40 and o["memory_budget"] == 1024 for o in built)
    stored = RunConfig.from_dict(load_checkpoint(tmp_path / "chunked")["args"])
    assert (stored.chunk_tokens, stored.memory_budget, stored.data) == (40, 1024, "world-hard")
    chunked_model, full_model = (load_checkpoint(tmp_path / d)["model"] for d in ("chunked", "full"))
    for name in full_model:  # the tiny BERT has no dropout: the same gradients, so the same weights
        torch.testing.assert_close(chunked_model[name], full_model[name], rtol=1e-4, atol=1e-5)


def test_the_hard_world_is_other_data_than_the_default(tmp_path, tiny_bert):
    for data in ("world", "world-hard"):
        assert main(_args(tiny_bert, tmp_path / data, "--data", data, "--steps", "1")) == 0
    initial = [json.loads((tmp_path / d / "metrics.json").read_text())["mrr@10_initial"] for d in ("world", "world-hard")]
    assert initial[0] != initial[1]


@pytest.mark.parametrize("size, expected", [("1000", 1000), ("2K", 2048), ("1.5M", 3 * 2**19), ("2g", 2 * 2**30)])
def test_memory_budget_sizes(size, expected):
    from gradcache.train.modes.memory_size import memory_bytes

    assert memory_bytes(size) == expected


@pytest.mark.parametrize("extra, fragment", [
    (["--chunk-tokens", "0"], "--chunk-tokens must be at least 1, got 0"),
    (["--chunk-tokens", "64", "--strategy", "naive"], "--chunk-tokens does not apply to --strategy naive"),
    (["--memory-budget", "lots"], "'lots' is not a size in bytes"),
])
def test_bad_chunking_options_exit_2_and_write_nothing(tmp_path, tiny_bert, capsys, extra, fragment):
    out = tmp_path / "out"
    assert main(_args(tiny_bert, out, *extra)) == 2
    assert fragment in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("size, fragment", [
    ("-5", "'-5' is a negative size in bytes"), ("-0.5", "'-0.5' is a negative size in bytes"),
    ("lots", "'lots' is not a size in bytes"), ("inf", "'inf' is not a finite size in bytes"),
])
def test_a_bad_memory_budget_is_named_once(tmp_path, tiny_bert, capsys, size, fragment):
    out = tmp_path / "out"
    assert main(_args(tiny_bert, out, "--memory-budget", size)) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # the line after argparse's usage
    assert f"argument --memory-budget: {fragment}; give e.g. 2G, 500M or 1000000" in error
    assert error.count("memory-budget") + error.count("memory_budget") == 1, error
    assert not out.exists()


def test_a_version_3_checkpoint_reads_with_the_options_off():
    stored = RunConfig(mode="text").to_dict()
    for name in ("memory_budget", "chunk_tokens"):
        del stored[name]
    stored["config_version"] = 3
    read = RunConfig.from_dict(stored)
    assert read.memory_budget is None and read.chunk_tokens is None
